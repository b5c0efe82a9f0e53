from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SamplingParams(_message.Message):
    __slots__ = ("n", "temperature", "top_k", "top_p", "max_tokens", "seed", "stop")
    N_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    n: int
    temperature: float
    top_k: int
    top_p: float
    max_tokens: int
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, n: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., max_tokens: _Optional[int] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ...) -> None: ...

class Path(_message.Message):
    __slots__ = ("path_id", "prompt_id", "group_id", "token_ids", "logprobs", "text", "finish_reason", "weight_version", "sampling", "reward", "reward_components", "reward_status", "worker", "weight", "verifier_reward", "verifier_status", "token_turns", "turn_rewards", "turns", "env_info", "env_seconds")
    class RewardComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class EnvInfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PATH_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    REWARD_COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    REWARD_STATUS_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_REWARD_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_STATUS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_TURNS_FIELD_NUMBER: _ClassVar[int]
    TURN_REWARDS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    ENV_INFO_FIELD_NUMBER: _ClassVar[int]
    ENV_SECONDS_FIELD_NUMBER: _ClassVar[int]
    path_id: str
    prompt_id: str
    group_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    text: str
    finish_reason: str
    weight_version: int
    sampling: SamplingParams
    reward: float
    reward_components: _containers.ScalarMap[str, float]
    reward_status: str
    worker: str
    weight: float
    verifier_reward: float
    verifier_status: str
    token_turns: _containers.RepeatedScalarFieldContainer[int]
    turn_rewards: _containers.RepeatedScalarFieldContainer[float]
    turns: int
    env_info: _containers.ScalarMap[str, str]
    env_seconds: float
    def __init__(self, path_id: _Optional[str] = ..., prompt_id: _Optional[str] = ..., group_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., text: _Optional[str] = ..., finish_reason: _Optional[str] = ..., weight_version: _Optional[int] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., reward: _Optional[float] = ..., reward_components: _Optional[_Mapping[str, float]] = ..., reward_status: _Optional[str] = ..., worker: _Optional[str] = ..., weight: _Optional[float] = ..., verifier_reward: _Optional[float] = ..., verifier_status: _Optional[str] = ..., token_turns: _Optional[_Iterable[int]] = ..., turn_rewards: _Optional[_Iterable[float]] = ..., turns: _Optional[int] = ..., env_info: _Optional[_Mapping[str, str]] = ..., env_seconds: _Optional[float] = ...) -> None: ...

class PathGroup(_message.Message):
    __slots__ = ("run_id", "group_id", "prompt_id", "prompt", "prompt_token_ids", "reference", "paths", "weight_version", "worker", "generate_seconds", "score_seconds", "part_index", "part_count", "generated", "dropped", "stats", "error", "eval", "extra")
    class DroppedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class StatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class ExtraEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    GENERATE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SCORE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PART_INDEX_FIELD_NUMBER: _ClassVar[int]
    PART_COUNT_FIELD_NUMBER: _ClassVar[int]
    GENERATED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EVAL_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    group_id: str
    prompt_id: str
    prompt: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    reference: str
    paths: _containers.RepeatedCompositeFieldContainer[Path]
    weight_version: int
    worker: str
    generate_seconds: float
    score_seconds: float
    part_index: int
    part_count: int
    generated: int
    dropped: _containers.ScalarMap[str, int]
    stats: _containers.ScalarMap[str, float]
    error: str
    eval: bool
    extra: _containers.ScalarMap[str, str]
    def __init__(self, run_id: _Optional[str] = ..., group_id: _Optional[str] = ..., prompt_id: _Optional[str] = ..., prompt: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., reference: _Optional[str] = ..., paths: _Optional[_Iterable[_Union[Path, _Mapping]]] = ..., weight_version: _Optional[int] = ..., worker: _Optional[str] = ..., generate_seconds: _Optional[float] = ..., score_seconds: _Optional[float] = ..., part_index: _Optional[int] = ..., part_count: _Optional[int] = ..., generated: _Optional[int] = ..., dropped: _Optional[_Mapping[str, int]] = ..., stats: _Optional[_Mapping[str, float]] = ..., error: _Optional[str] = ..., eval: _Optional[bool] = ..., extra: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ExploreParams(_message.Message):
    __slots__ = ("oversample_m", "dedup", "dedup_threshold", "retention", "predictor", "predictor_prefix_tokens", "dedup_method", "embedding_model")
    OVERSAMPLE_M_FIELD_NUMBER: _ClassVar[int]
    DEDUP_FIELD_NUMBER: _ClassVar[int]
    DEDUP_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    PREDICTOR_FIELD_NUMBER: _ClassVar[int]
    PREDICTOR_PREFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEDUP_METHOD_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    oversample_m: int
    dedup: str
    dedup_threshold: float
    retention: float
    predictor: str
    predictor_prefix_tokens: int
    dedup_method: str
    embedding_model: str
    def __init__(self, oversample_m: _Optional[int] = ..., dedup: _Optional[str] = ..., dedup_threshold: _Optional[float] = ..., retention: _Optional[float] = ..., predictor: _Optional[str] = ..., predictor_prefix_tokens: _Optional[int] = ..., dedup_method: _Optional[str] = ..., embedding_model: _Optional[str] = ...) -> None: ...

class EnvironmentParams(_message.Message):
    __slots__ = ("address", "max_turns", "max_total_tokens", "step_timeout_s", "episode_timeout_s", "max_inflight_steps", "reward", "chat", "chat_turn")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    EPISODE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MAX_INFLIGHT_STEPS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    CHAT_TURN_FIELD_NUMBER: _ClassVar[int]
    address: str
    max_turns: int
    max_total_tokens: int
    step_timeout_s: float
    episode_timeout_s: float
    max_inflight_steps: int
    reward: str
    chat: bool
    chat_turn: ChatTurn
    def __init__(self, address: _Optional[str] = ..., max_turns: _Optional[int] = ..., max_total_tokens: _Optional[int] = ..., step_timeout_s: _Optional[float] = ..., episode_timeout_s: _Optional[float] = ..., max_inflight_steps: _Optional[int] = ..., reward: _Optional[str] = ..., chat: _Optional[bool] = ..., chat_turn: _Optional[_Union[ChatTurn, _Mapping]] = ...) -> None: ...

class ChatTurn(_message.Message):
    __slots__ = ("close", "before", "after")
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    close: str
    before: str
    after: str
    def __init__(self, close: _Optional[str] = ..., before: _Optional[str] = ..., after: _Optional[str] = ...) -> None: ...

class PromptJob(_message.Message):
    __slots__ = ("run_id", "job_id", "group_id", "prompt_id", "prompt", "reference", "sampling", "reward_fn", "learner_step", "part_index", "part_count", "path_offset", "explore", "extra", "eval", "verifier_fn", "verifier_sample", "prompt_token_ids", "env", "min_weight_version")
    class ExtraEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    REWARD_FN_FIELD_NUMBER: _ClassVar[int]
    LEARNER_STEP_FIELD_NUMBER: _ClassVar[int]
    PART_INDEX_FIELD_NUMBER: _ClassVar[int]
    PART_COUNT_FIELD_NUMBER: _ClassVar[int]
    PATH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EXPLORE_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    EVAL_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_FN_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    MIN_WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    job_id: str
    group_id: str
    prompt_id: str
    prompt: str
    reference: str
    sampling: SamplingParams
    reward_fn: str
    learner_step: int
    part_index: int
    part_count: int
    path_offset: int
    explore: ExploreParams
    extra: _containers.ScalarMap[str, str]
    eval: bool
    verifier_fn: str
    verifier_sample: float
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    env: EnvironmentParams
    min_weight_version: int
    def __init__(self, run_id: _Optional[str] = ..., job_id: _Optional[str] = ..., group_id: _Optional[str] = ..., prompt_id: _Optional[str] = ..., prompt: _Optional[str] = ..., reference: _Optional[str] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., reward_fn: _Optional[str] = ..., learner_step: _Optional[int] = ..., part_index: _Optional[int] = ..., part_count: _Optional[int] = ..., path_offset: _Optional[int] = ..., explore: _Optional[_Union[ExploreParams, _Mapping]] = ..., extra: _Optional[_Mapping[str, str]] = ..., eval: _Optional[bool] = ..., verifier_fn: _Optional[str] = ..., verifier_sample: _Optional[float] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., env: _Optional[_Union[EnvironmentParams, _Mapping]] = ..., min_weight_version: _Optional[int] = ...) -> None: ...

class WeightVersion(_message.Message):
    __slots__ = ("version", "uri", "sha256", "kind", "base_version", "created_ms", "bytes")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    version: int
    uri: str
    sha256: str
    kind: str
    base_version: int
    created_ms: int
    bytes: int
    def __init__(self, version: _Optional[int] = ..., uri: _Optional[str] = ..., sha256: _Optional[str] = ..., kind: _Optional[str] = ..., base_version: _Optional[int] = ..., created_ms: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class Metric(_message.Message):
    __slots__ = ("run_id", "step", "time", "values", "event", "message")
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step: int
    time: float
    values: _containers.ScalarMap[str, float]
    event: str
    message: str
    def __init__(self, run_id: _Optional[str] = ..., step: _Optional[int] = ..., time: _Optional[float] = ..., values: _Optional[_Mapping[str, float]] = ..., event: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...
