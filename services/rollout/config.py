from __future__ import annotations

from pydantic import Field, field_validator

from brorl.config.base import StrictModel
from brorl.contract import KeyName
from brorl.rpc import metrics_bind_field
from brorl.security import InferenceSecurityConfig
from brorl.cluster import DEFAULT, METRICS_PORTS, REDIS_URL, ROLLOUT_PORT, address


class EngineConfig(StrictModel):
    dtype: str = Field("float32", description="Model dtype in vLLM.")
    max_model_len: int | None = Field(
        None,
        ge=8,
        description="Prompt + completion tokens per path (unset: the model's "
        "max_position_embeddings, as the learner's prompt check assumes).",
    )
    max_num_seqs: int = Field(512, ge=1, description="Sequences vLLM batches in one engine step.")
    gpu_memory_utilization: float = Field(
        0.3, gt=0, le=1, description="On CPU: fraction of a NUMA node's RAM vLLM reserves."
    )
    kv_cache_gib: int = Field(1, ge=1, description="VLLM_CPU_KVCACHE_SPACE on CPU (GiB).")
    enable_prefix_caching: bool = Field(True, description="Compute a group's shared prompt once.")
    cpu_threads_bind: str = Field(
        "auto",
        pattern=r"^(auto|nobind|[0-9][0-9,\-]*)$",
        description=(
            "vLLM-CPU's VLLM_CPU_OMP_THREADS_BIND: the cores the model's threads are pinned to "
            "in vLLM's own processes (in_process false). 'auto' lets vLLM choose (it reserves "
            "the last core for its scheduler, so on a 2-core machine every engine lands on core "
            "0), 'nobind' leaves placement to the OS, or a core list such as '1' or '0-1'. An "
            "in-process engine is not pinned by it (OpenMP is running by then): pin the service "
            "process (the local cluster does: brorl/apps/cluster/placement.py). Ignored on CUDA."
        ),
    )
    in_process: bool = Field(
        True,
        description=(
            "Run vLLM's engine core and model worker inside the rollout service's process "
            "(VLLM_ENABLE_V1_MULTIPROCESSING=0, the 'uni' executor); false: two child processes "
            "that hand each engine step over shared memory and busy-wait on their queues (vLLM's "
            "SpinCondition: 1 s of sched_yield after every message), which took a core from the "
            "learner on 2 cores (docs/performance.md). On a GPU the child processes let vLLM's "
            "front end overlap the model (not measured here)."
        ),
    )
    seed: int = Field(0, description="Engine seed.")

    @field_validator("cpu_threads_bind", mode="before")
    @classmethod
    def _core_number_as_text(cls, value):
        return str(value) if isinstance(value, int) else value  # `cpu_threads_bind=1` parses as 1


class RolloutServiceConfig(StrictModel):
    model: str = Field(
        ..., description="Hugging Face model directory (the policy's initial weights, version 0)."
    )
    bind: str = Field(
        address(ROLLOUT_PORT),
        description="host:port of the RolloutService (port 0 picks a free one).",
    )
    redis_url: str = Field(REDIS_URL, description="Redis holding the work streams.")
    reward_address: str = Field(
        address(DEFAULT.reward_port),
        description="RewardService host:port used by the worker loop.",
    )
    run_id: str = Field(
        "",
        pattern=f"^$|{KeyName.PATTERN}",
        description="Run to work for; empty follows the active run of the learner in `namespace`.",
    )
    namespace: str = Field(
        KeyName.DEFAULT_NAMESPACE,
        pattern=KeyName.PATTERN,
        description=(
            "Cluster namespace: workers follow the learner of the same namespace (clusters sharing "
            "a Redis stay apart)."
        ),
    )
    worker_loop: bool = Field(
        True, description="Consume prompt jobs from Redis (off: serve Generate only)."
    )
    max_n: int = Field(1024, ge=1, description="Largest n accepted by Generate.")
    max_concurrent_rpcs: int = Field(
        64,
        ge=1,
        le=100_000,
        description=(
            "Admission control: RPCs in flight (an open GenerateStream and health checks count) "
            "before more are answered RESOURCE_EXHAUSTED at once; Generate calls take the engine "
            "one at a time, so the rest wait within this bound (docs/reliability.md)."
        ),
    )
    claim_idle_ms: int = Field(
        30_000,
        ge=100,
        description=(
            "Reclaim a prompt job when its worker has not renewed its lease for this long "
            "(a live worker renews every third of it)."
        ),
    )
    overlap_tail: bool = Field(
        True,
        description=(
            "Select, score and publish an engine call's groups on a second thread while the "
            "engine samples the next call (services/rollout/tail/runners.py), one call's tail at a "
            "time: the engine keeps sampling while the reward service scores. false: the loop "
            "does each call start to end."
        ),
    )
    tail_process: bool = Field(
        True,
        description=(
            "Run each call's tail (selection, scoring, publishing) in a process of the worker's "
            "own (services/rollout/tail/process.py), on background_cores where given: the "
            "tail's Python then neither holds the engine's GIL nor, with background cores, its "
            "core. false: on the worker's tail thread (or in its loop, overlap_tail false)."
        ),
    )
    batch_paths: int = Field(
        512,
        ge=1,
        description=(
            "Claim prompt jobs until their candidates fill this many paths and sample the ones "
            "with equal sampling settings in one engine call (services/rollout/batching.py): "
            "narrow groups share vLLM's decode steps and their paths are scored in one request; "
            "each group is still published on its own. 1: one job per call."
        ),
    )
    reward_deadline_s: float = Field(
        120.0,
        gt=0,
        description="Deadline of the reward call for one group (a call scoring several groups "
        "together gets this per group).",
    )
    weight_fetch_deadline_s: float = Field(
        60.0,
        gt=0,
        description=(
            "How long the worker waits between jobs for a new weight version's files to be read "
            "and verified; past it the stall is logged and counted "
            "(rollout/weights_fetch_stalls) and the worker keeps serving the version it has."
        ),
    )
    version_wait_s: float = Field(
        600.0,
        gt=0,
        description=(
            "How long the worker holds claimed jobs for the weight version they ask for "
            "(PromptJob.min_weight_version: the oldest the learner will not drop as stale); "
            "past it they are sampled with the version the engine has, and the wait is counted "
            "(rollout/version_waits_expired)."
        ),
    )
    watch_weights: bool = Field(
        True,
        description=(
            "Listen to the run's announced weight versions while the engine samples and fetch, "
            "verify and stage each at once beside the call (services/rollout/weight_sync.py), "
            "so that the next call only swaps it in. false: all of it between calls."
        ),
    )
    background_cores: list[int] = Field(
        default_factory=list,
        description=(
            "Cores the weight fetch and staging may run on besides the service's own (the local "
            "cluster passes every core it uses: the staging then takes no time from the engine "
            "pinned to its cores). Empty: the service's cores only."
        ),
    )
    tail_nice: int = Field(
        0,
        ge=0,
        le=19,
        description=(
            "Nice value of the tail process (tail_process), in a session and so a scheduling "
            "autogroup of its own (brorl/priority.py): on background_cores it then takes their "
            "idle time, not the learner's update (the local cluster passes its background_nice "
            "there). 0: the worker's priority, in the worker's session."
        ),
    )
    engine: EngineConfig = Field(
        default_factory=EngineConfig, description="The vLLM engine of this worker."
    )
    port_file: str = Field("", description="If set, the bound port is written here once serving.")
    metrics_bind: str = metrics_bind_field(METRICS_PORTS["rollout"])
    security: InferenceSecurityConfig = Field(
        default_factory=InferenceSecurityConfig,
        description="Token and TLS of this server and of its calls to reward (docs/security.md).",
    )
