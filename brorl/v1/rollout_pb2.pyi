from brorl.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "sampling", "prompt_id")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    sampling: _common_pb2.SamplingParams
    prompt_id: str
    def __init__(self, prompt: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., prompt_id: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("paths", "weight_version", "prompt_token_ids", "seconds")
    PATHS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    paths: _containers.RepeatedCompositeFieldContainer[_common_pb2.Path]
    weight_version: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    seconds: float
    def __init__(self, paths: _Optional[_Iterable[_Union[_common_pb2.Path, _Mapping]]] = ..., weight_version: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., seconds: _Optional[float] = ...) -> None: ...

class RolloutStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RolloutStatus(_message.Message):
    __slots__ = ("worker", "model", "weight_version", "paths_generated", "tokens_generated", "max_n", "ready")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PATHS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    MAX_N_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    worker: str
    model: str
    weight_version: int
    paths_generated: int
    tokens_generated: int
    max_n: int
    ready: bool
    def __init__(self, worker: _Optional[str] = ..., model: _Optional[str] = ..., weight_version: _Optional[int] = ..., paths_generated: _Optional[int] = ..., tokens_generated: _Optional[int] = ..., max_n: _Optional[int] = ..., ready: _Optional[bool] = ...) -> None: ...
