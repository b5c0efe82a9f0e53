from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreRequest(_message.Message):
    __slots__ = ("reward_fn", "prompt", "completion", "reference", "id", "extra")
    class ExtraEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REWARD_FN_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    reward_fn: str
    prompt: str
    completion: str
    reference: str
    id: str
    extra: _containers.ScalarMap[str, str]
    def __init__(self, reward_fn: _Optional[str] = ..., prompt: _Optional[str] = ..., completion: _Optional[str] = ..., reference: _Optional[str] = ..., id: _Optional[str] = ..., extra: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ScoreResult(_message.Message):
    __slots__ = ("id", "reward", "components", "status", "detail", "latency_ms")
    class ComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    id: str
    reward: float
    components: _containers.ScalarMap[str, float]
    status: str
    detail: str
    latency_ms: float
    def __init__(self, id: _Optional[str] = ..., reward: _Optional[float] = ..., components: _Optional[_Mapping[str, float]] = ..., status: _Optional[str] = ..., detail: _Optional[str] = ..., latency_ms: _Optional[float] = ...) -> None: ...

class ScoreBatchRequest(_message.Message):
    __slots__ = ("reward_fn", "items")
    REWARD_FN_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    reward_fn: str
    items: _containers.RepeatedCompositeFieldContainer[ScoreRequest]
    def __init__(self, reward_fn: _Optional[str] = ..., items: _Optional[_Iterable[_Union[ScoreRequest, _Mapping]]] = ...) -> None: ...

class ScoreBatchResponse(_message.Message):
    __slots__ = ("results", "latency_ms")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ScoreResult]
    latency_ms: float
    def __init__(self, results: _Optional[_Iterable[_Union[ScoreResult, _Mapping]]] = ..., latency_ms: _Optional[float] = ...) -> None: ...

class ListRewardFunctionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RewardFunctionInfo(_message.Message):
    __slots__ = ("name", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class ListRewardFunctionsResponse(_message.Message):
    __slots__ = ("functions",)
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    functions: _containers.RepeatedCompositeFieldContainer[RewardFunctionInfo]
    def __init__(self, functions: _Optional[_Iterable[_Union[RewardFunctionInfo, _Mapping]]] = ...) -> None: ...
