from __future__ import annotations

from pydantic import Field, model_validator

from brorl.config.base import StrictModel
from brorl.contract import KeyName
from brorl.rpc import metrics_bind_field
from brorl.security import SecurityConfig
from brorl.cluster import DEFAULT, METRICS_PORTS, REDIS_URL, address


class LearnerServiceConfig(StrictModel):
    bind: str = Field(
        address(DEFAULT.learner_port),
        description="host:port of the LearnerService (port 0 picks a free one).",
    )
    redis_url: str = Field(REDIS_URL, description="Redis holding the work streams.")
    runs_dir: str = Field(
        "runs",
        description=(
            "Each run writes config, metrics.jsonl, checkpoints and final weights under "
            "runs_dir/<run_id>."
        ),
    )
    weights_dir: str = Field(
        "",
        description=(
            "Weight store root shared with the rollout workers; default runs_dir/<run_id>/weights."
        ),
    )
    namespace: str = Field(
        KeyName.DEFAULT_NAMESPACE,
        pattern=KeyName.PATTERN,
        description=(
            "Cluster namespace announced to the rollout workers (clusters sharing a Redis stay "
            "apart)."
        ),
    )
    namespace_lease_s: float = Field(
        15.0,
        gt=0,
        le=600,
        description=(
            "The learner holds its namespace from StartRun to the run's end, renewed every third "
            "of this (brorl.queue.NamespaceLease): another learner's StartRun in the namespace is "
            "refused meanwhile; a learner that dies frees it after this long."
        ),
    )
    zero_stage: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage of the learner.")
    ranks: int = Field(
        1,
        ge=1,
        le=64,
        description="Learner ranks (data parallel): this process is rank 0 and starts the others "
        "(a launcher's RANK/WORLD_SIZE, e.g. torchrun's, take precedence) (docs/scaling.md).",
    )
    collective_timeout_s: float = Field(
        60.0,
        gt=0,
        description="With several ranks: a collective that waits this long for a rank fails the "
        "run (a rank that died).",
    )
    torch_threads: int = Field(0, ge=0, description="torch intra-op threads (0: torch's default).")
    borrow_cores: list[int] = Field(
        default_factory=list,
        description="The rollout workers' cores, which an update also uses (one more torch "
        "thread each) while the run has no job waiting or being sampled, and gives back as soon "
        "as it has (services/learner/cores.py; checked between chunks and between the model's "
        "layers); the weight-publish thread may run on them at any time. The local launcher sets "
        "it when it pins the learner apart from the workers; empty: never. Needs ranks 1.",
    )
    keep_weight_versions: int = Field(3, ge=1, description="Published versions kept in the store.")
    port_file: str = Field("", description="If set, the bound port is written here once serving.")
    metrics_bind: str = metrics_bind_field(METRICS_PORTS["learner"])
    max_concurrent_rpcs: int = Field(
        32,
        ge=2,
        le=1024,
        description=(
            "Admission control: RPCs in flight before more are answered RESOURCE_EXHAUSTED. Every "
            "open WatchRun stream holds one for the life of the run, and the learner has one "
            "handler thread per slot, so a control RPC (StopRun, Checkpoint) is either answered "
            "or refused at once, never queued behind watchers (docs/reliability.md)."
        ),
    )
    read_roots: list[str] = Field(
        default_factory=lambda: ["."],
        description=(
            "Directories the paths of a run config (model, data.train_path, "
            "explore.embedding_model) must lie under once symlinks and '..' are resolved; any "
            "other path is PERMISSION_DENIED. Relative entries are relative to the learner's "
            "working directory; runs_dir is always allowed; ['/'] allows every path."
        ),
    )
    security: SecurityConfig = Field(
        default_factory=SecurityConfig,
        description=(
            "Token and TLS (docs/security.md); with a token, every LearnerService RPC needs it."
        ),
    )

    @model_validator(mode="after")
    def _borrow_with_one_rank(self):
        if self.borrow_cores and self.ranks > 1:
            raise ValueError("borrow_cores needs ranks: 1 (the ranks' threads are not moved)")
        if any(c < 0 for c in self.borrow_cores):
            raise ValueError(f"borrow_cores: core numbers are >= 0, got {self.borrow_cores}")
        return self
