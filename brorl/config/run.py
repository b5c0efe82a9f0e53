"""The run config a client hands to LearnerService.StartRun (YAML or JSON).

It lives in the shared core so any client can validate a config before sending it; the
learner validates it again and answers INVALID_ARGUMENT naming the field. What a section
means for the prompt jobs sent to the rollout workers is decided in ``brorl.sampling``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from brorl.contract import RewardStatus
from brorl.config.base import StrictModel, parse_text, validate
from brorl.config.environment import EnvironmentConfig
from brorl.config.monitors import MonitorsConfig
from brorl.config.tracking import LoggingConfig
from brorl.config.train import TrainConfig
from brorl.config.sampling import (  # noqa: F401 - the run config's sections, importable from here
    AdaptiveBudget,
    ConstantSchedule,
    ExploreConfig,
    LinearSchedule,
    SamplingConfig,
    StagedSchedule,
    UniformBudget,
)


class FieldMap(StrictModel):
    prompt: str = Field(
        "prompt",
        min_length=1,
        description="Column of the prompt: a string, or a chat `messages` list of {role, "
        "content} rendered with the model's chat template.",
    )
    reference: str = Field(
        "reference",
        min_length=1,
        description="Column of the ground truth handed to the reward function (missing: empty; "
        "non-strings JSON-encoded).",
    )
    extra: list[str] = Field(
        default_factory=list,
        description="Further columns handed to the reward function beside the reference "
        "(ScoreRequest.extra; non-strings JSON-encoded).",
    )
    stratum: str = Field(
        "",
        description="Column naming each prompt's stratum (e.g. a difficulty label): "
        "evaluation rounds also log eval/accuracy/<stratum>, and the training groups are "
        "counted per stratum (explore/groups/<stratum>, ...; '': none).",
    )


class DataConfig(StrictModel):
    train_path: str = Field(
        ...,
        description="Prompt data: a JSONL/JSON, Parquet or CSV/TSV file, a directory saved by "
        "`datasets` (save_to_disk), or a directory of data files of one format.",
    )
    format: Literal["auto", "jsonl", "json", "parquet", "csv", "tsv", "hf_dataset"] = Field(
        "auto", description="How to read the data files ('auto': from the suffix or directory)."
    )
    split: str = Field(
        "train", min_length=1, description="Split of a saved `datasets` DatasetDict to train on."
    )
    fields: FieldMap = Field(
        default_factory=FieldMap, description="Which columns hold the prompt, reference, extras."
    )
    chat_template: str = Field(
        "",
        description="Jinja chat template for `messages` prompts, overriding the tokenizer's "
        "own ('': the tokenizer's).",
    )
    shuffle_seed: int = Field(
        0, description="Seed of the prompt order (a new permutation each epoch)."
    )
    eval_path: str = Field(
        "", description="Held-out prompts (same formats and fields) for `eval_every`."
    )
    eval_split: str = Field(
        "", description="Held-out prompts from this split of the saved DatasetDict instead."
    )
    eval_fraction: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Held-out prompts as this share of the training rows instead (taken out "
        "of training, chosen by shuffle_seed).",
    )
    eval_max_prompts: int = Field(
        64,
        ge=1,
        description="At most this many held-out prompts per evaluation (each is one prompt "
        "job for the workers).",
    )

    @model_validator(mode="after")
    def _one_heldout_source(self):
        given = [n for n in ("eval_path", "eval_split", "eval_fraction") if getattr(self, n)]
        if len(given) > 1:
            raise ValueError(f"set one held-out source, not {' and '.join(given)}")
        return self


class AsyncConfig(StrictModel):
    max_staleness: int = Field(
        2,
        ge=0,
        description="Groups generated more than this many weight versions ago are dropped "
        "(counted).",
    )
    publish_every: int = Field(
        1, ge=1, description="Publish a weight version every this many updates."
    )
    publish_lag: int = Field(
        0,
        ge=0,
        description="Staleness ablation: the workers get each weight version this many "
        "versions late, so every path is at least this stale (0: at once).",
    )
    publish_in_background: bool = Field(
        True,
        description="Write each weight version and point the workers at it on a background "
        "thread while the next update runs (one version in flight); false: within the step.",
    )
    max_inflight_groups: int = Field(
        4,
        ge=1,
        description="Groups enqueued but not yet consumed (bounds staleness and Redis size); "
        "the learner sends them a step's groups at a time, or half this bound where that is less.",
    )
    group_timeout_s: float = Field(
        600.0, gt=0, description="Fail the run if no group arrives for this long."
    )
    max_degenerate_streak: int = Field(
        500,
        ge=1,
        description="Fail the run after this many groups in a row whose rewards were all equal "
        "(the task is too hard or too easy for the policy).",
    )
    dead_letter_retries: int = Field(
        1,
        ge=0,
        description="Re-send a prompt job the workers dead-lettered this many times (new job "
        "id); after that its part is given up and the group completes without it, or is "
        "dropped as lost (docs/reliability.md).",
    )
    part_deadline_s: float = Field(
        300.0,
        gt=0,
        description="A fanned-out group whose first part arrived this long ago is completed "
        "from the parts that did arrive (a part later is a counted duplicate).",
    )
    redis_outage_s: float = Field(
        60.0,
        gt=0,
        description="How long the learner waits for Redis to come back (restart, network) "
        "before the run fails; nothing acknowledged is lost meanwhile.",
    )
    run_keys_ttl_s: int = Field(
        86_400,
        ge=1,
        description="When a run ends its Redis keys (streams, done set, weight pointer) expire "
        "after this many seconds.",
    )
    excluded_reward_statuses: list[str] = Field(
        default_factory=lambda: list(RewardStatus.FAILED),
        description="Reward statuses whose paths are left out of advantages and counted "
        "(a failed evaluation is not a zero reward); a group left with fewer than 2 paths is "
        "dropped as reward_failed. Non-finite rewards are always left out.",
    )


class WeightsConfig(StrictModel):
    serving_dtype: Literal["bf16", "fp32"] = Field(
        "bf16",
        description="dtype of the published weight versions (the learner keeps fp32 master "
        "weights): bf16 halves every keyframe and makes deltas sparse (docs/weights.md); "
        "fp32 serves the learner's exact weights. An fp32 rollout engine runs bf16 versions "
        "as their exact fp32 values.",
    )
    keyframe_every: int = Field(
        10,
        ge=1,
        le=10_000,
        description="Publish a full keyframe every this many versions and a delta against the "
        "previous version in between (1: every version is a keyframe). A worker that missed "
        "versions rebuilds from the last keyframe, so this bounds its catch-up chain.",
    )


class ProbeConfig(StrictModel):
    path: str = Field(
        ..., description='JSONL of {"prompt": ..., "reference": ...}: the probe prompts.'
    )
    every: int = Field(
        1, ge=1, description="Measure the probes' correct-answer log-prob every this many updates."
    )


class RunConfig(StrictModel):
    model: str = Field(
        ...,
        description="Hugging Face model directory of the initial policy (the rollout workers "
        "load the same).",
    )
    data: DataConfig = Field(description="Where the prompts come from.")
    reward_fn: str = Field(
        "math_answer",
        min_length=1,
        description="Reward function name in the reward service's registry.",
    )
    sampling: SamplingConfig = Field(
        default_factory=SamplingConfig, description="How each prompt's paths are sampled."
    )
    explore: ExploreConfig = Field(
        default_factory=ExploreConfig,
        description="Broadened exploration on the rollout side (docs/exploration.md).",
    )
    train: TrainConfig = Field(default_factory=TrainConfig, description="The policy update.")
    asynchrony: AsyncConfig = Field(
        default_factory=AsyncConfig,
        alias="async",
        description="Bounded staleness between sampling and learning.",
    )
    weights: WeightsConfig = Field(
        default_factory=WeightsConfig,
        description="How weight versions are published: serving dtype, keyframes and deltas.",
    )
    checkpoint_every: int = Field(
        20,
        ge=0,
        description="Checkpoint every this many updates (0: only on request and at the end); "
        "a resumed run repeats at most this many updates.",
    )
    samples_every: int = Field(
        5,
        ge=0,
        description="Every this many updates, write the step's best, worst and one random path "
        "(prompt, completion, reward) to samples.jsonl in the run directory, for `brorl "
        "report` (0: never).",
    )
    monitors: MonitorsConfig = Field(
        default_factory=MonitorsConfig,
        description="Detectors of KL spikes, entropy collapse, length blow-up, reward hacking and "
        "reward variance collapse, and the action an alarm takes (docs/monitors.md).",
    )

    eval_every: int = Field(
        0,
        ge=0,
        description="Evaluate the held-out prompts (data.eval_*) greedily at the start, every "
        "this many updates and at the end; logs eval/accuracy and eval/reward_mean (0: only "
        "at the start and end when held-out prompts are set).",
    )
    logging: LoggingConfig = Field(
        default_factory=LoggingConfig,
        description="Where metrics go besides metrics.jsonl: TensorBoard, W&B, MLflow "
        "(docs/observability.md).",
    )
    probe: ProbeConfig | None = Field(
        None,
        description="Probe mass (services/learner/observe/probe.py): the change of the policy's "
        "log-prob of known correct answers, logged as probe/* (none: off).",
    )
    env: EnvironmentConfig | None = Field(
        None,
        description="Multi-turn episodes against an EnvironmentService (docs/environments.md); "
        "none: every path is one completion.",
    )

    model_config = StrictModel.model_config | {"populate_by_name": True}

    @model_validator(mode="after")
    def _budget_fits(self):
        b, k = self.sampling.budget, self.train.groups_per_step
        if b.kind == "adaptive" and not k * b.n_min <= b.total <= k * b.n_max:
            raise ValueError(
                f"sampling.budget.total = {b.total} cannot be split over train.groups_per_step "
                f"= {k} groups of {b.n_min}..{b.n_max} paths: it must lie in "
                f"[{k * b.n_min}, {k * b.n_max}]"
            )
        return self

    @model_validator(mode="after")
    def _keep_paths_below_the_width(self):
        keep, widest = self.train.keep_paths, self.sampling.widest
        if keep >= widest:  # 0 (every path) is below any width
            raise ValueError(
                f"train.keep_paths = {keep} keeps every path of this run's groups (at most "
                f"{widest}: sampling.n / budget.n_max): set it below that, or 0 for every path"
            )
        return self


def parse_run_config(text: str) -> RunConfig:
    return validate(RunConfig, parse_text(text, source="config_yaml"))
