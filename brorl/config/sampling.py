"""The run config's sampling sections: how each prompt's paths are sampled (temperature
schedules, the per-prompt path budget) and the rollout side's broadened exploration. Part of
``brorl.config.run.RunConfig``; what they mean for a prompt job is decided in ``brorl.sampling``.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from brorl.config import schedule
from brorl.config.base import StrictModel


class _Schedule(StrictModel):
    """A temperature schedule section; built once into a ``brorl.config.schedule`` callable."""

    _built: schedule.Schedule | None = PrivateAttr(default=None)

    def _build(self) -> schedule.Schedule:
        raise NotImplementedError

    @model_validator(mode="after")
    def _check(self):
        try:
            self._built = self._build()
        except (ValueError, TypeError) as exc:
            raise ValueError(f"invalid temperature schedule: {exc}") from None
        return self

    def at(self, step: int) -> float:
        return self._built(step)


class ConstantSchedule(_Schedule):
    kind: Literal["constant"] = Field(description="The same temperature at every step.")
    t: float = Field(1.0, description="The temperature (> 0).")

    def _build(self) -> schedule.Schedule:
        return schedule.constant(self.t)


class StagedSchedule(_Schedule):
    kind: Literal["staged"] = Field(description="temps[i] from bounds[i-1] to bounds[i].")
    bounds: list[int] = Field([1000, 3000], description="Step bounds, strictly increasing.")
    temps: list[float] = Field([1.3, 0.9, 0.7], description="One temperature more than bounds.")

    def _build(self) -> schedule.Schedule:
        return schedule.staged(self.bounds, self.temps)


class LinearSchedule(_Schedule):
    kind: Literal["linear"] = Field(description="Linear from t0 at step 0 to t1 at `steps`.")
    t0: float = Field(1.2, description="Temperature at step 0.")
    t1: float = Field(0.7, description="Temperature from `steps` on.")
    steps: int = Field(2000, description="Steps of the ramp (>= 1).")

    def _build(self) -> schedule.Schedule:
        return schedule.linear(self.t0, self.t1, self.steps)


TemperatureSchedule = Annotated[
    Union[ConstantSchedule, StagedSchedule, LinearSchedule], Field(discriminator="kind")
]


class UniformBudget(StrictModel):
    kind: Literal["uniform"] = Field(description="Every group gets `sampling.n` paths.")


class AdaptiveBudget(StrictModel):
    kind: Literal["adaptive"] = Field(
        description="Split `total` paths over each block of `train.groups_per_step` groups by "
        "their prompts' estimated pass rates (services/learner/feed/budget.py)."
    )
    total: int = Field(..., ge=1, description="Paths per block of train.groups_per_step groups.")
    n_min: int = Field(2, ge=1, description="Fewest paths a group gets.")
    n_max: int = Field(1024, ge=1, le=4096, description="Most paths a group gets.")
    objective: Literal["variance", "mixed_group"] = Field(
        "variance",
        description="'variance': minimise sum p(1-p)/n, the gradient estimate's variance "
        "(n ~ sqrt(p(1-p))); 'mixed_group': maximise the expected number of groups with both "
        "outcomes (docs/broadening.md).",
    )
    success_reward: float = Field(
        1.0, description="A path counts as a success for the pass-rate estimate at this reward."
    )

    @model_validator(mode="after")
    def _bounds(self):
        if self.n_max < self.n_min:
            raise ValueError(f"n_max ({self.n_max}) must be >= n_min ({self.n_min})")
        return self


PathBudget = Annotated[Union[UniformBudget, AdaptiveBudget], Field(discriminator="kind")]


class SamplingConfig(StrictModel):
    n: int = Field(512, ge=1, le=4096, description="Paths sampled per prompt (BroRL: 256-1024).")
    budget: PathBudget = Field(
        default_factory=lambda: UniformBudget(kind="uniform"),
        description="Paths per group: {kind: uniform} (`n` each) or {kind: adaptive, total, "
        "n_min, n_max} (more paths to prompts of uncertain pass rate).",
    )
    temperature: float = Field(
        1.0,
        ge=0.0,
        le=5.0,
        description="Sampling temperature; the learner scores log-probs at the same one.",
    )
    top_k: int = Field(
        40, ge=-1, description="Top-k cut-off; -1 disables. The learner applies the same cut-off."
    )
    top_p: float = Field(
        0.95,
        gt=0.0,
        le=1.0,
        description="Nucleus cut-off; 1 disables. The learner applies the same cut-off.",
    )
    max_tokens: int | None = Field(
        None,
        ge=1,
        le=32768,
        description="New tokens per path (unset: the model's generation_config max_new_tokens, "
        "else 16).",
    )
    stop: list[str] = Field(default_factory=list, description="Stop strings.")
    max_paths_per_job: int = Field(
        0,
        ge=0,
        description="Fan a group out into prompt jobs of at most this many paths, sampled by any "
        "workers and reassembled by the learner (0: one job per group).",
    )
    temperature_schedule: TemperatureSchedule | None = Field(
        None,
        description="Per-step temperature, overriding `temperature`: "
        "{kind: staged, bounds: [1000, 3000], temps: [1.3, 0.9, 0.7]} or "
        "{kind: linear, t0: 1.2, t1: 0.7, steps: 2000} or {kind: constant, t: 1.0}.",
    )

    @field_validator("temperature")
    @classmethod
    def _greedy_samples_one_path(cls, t: float, info: ValidationInfo) -> float:
        """Temperature 0 is greedy: one path per prompt. Refused here, at StartRun, for groups
        of more (the engine would refuse every job of the run)."""
        budget = info.data.get("budget")
        widest = max(info.data.get("n", 1), getattr(budget, "n_max", 0))
        if t == 0 and widest > 1:
            raise ValueError(
                f"0 is greedy (one path per prompt) but groups take {widest} paths "
                "(sampling.n / budget.n_max): set a temperature > 0, or n: 1"
            )
        return t

    @property
    def widest(self) -> int:
        """The most paths a group of the run takes: sampling.n, or the adaptive budget's n_max."""
        return max(self.n, getattr(self.budget, "n_max", 0))

    def temperature_at(self, step: int) -> float:
        """The sampling temperature of prompt jobs enqueued at learner ``step``."""
        if self.temperature_schedule is None:
            return self.temperature
        return self.temperature_schedule.at(step)


class ExploreConfig(StrictModel):
    oversample_m: int = Field(
        0,
        ge=0,
        le=65536,
        description="Hierarchical generation: sample M >= n candidates per prompt and keep n "
        "(0: off).",
    )
    dedup: Literal["off", "keep_one", "downweight"] = Field(
        "off",
        description="Near-duplicate paths: keep one per cluster, or down-weight each to "
        "1/cluster size.",
    )
    dedup_threshold: float = Field(
        0.8,
        gt=0.0,
        le=1.0,
        description="Similarity at which two paths count as duplicates: estimated Jaccard "
        "(minhash) or cosine (embedding).",
    )
    dedup_method: Literal["minhash", "embedding"] = Field(
        "minhash",
        description="minhash: token 3-gram sets (cheap default); embedding: cosine of mean-pooled "
        "embeddings from a locally installed encoder.",
    )
    embedding_model: str = Field(
        "",
        description="Local encoder directory (on the rollout workers) for dedup_method=embedding; "
        "nothing is downloaded.",
    )
    retention: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="Dynamic path filtering: keep at least this fraction, the highest-scored by "
        "the predictor; the rest skip reward evaluation (1: off).",
    )
    predictor: str = Field(
        "logprob",
        min_length=1,
        description="Quality predictor for filtering / oversampling: 'logprob' (policy mean "
        "log-prob) or a reward function name (e.g. a trained reward model) scored on "
        "a prefix.",
    )
    predictor_prefix_tokens: int = Field(
        0, ge=0, description="Tokens of each path the predictor sees (0: all)."
    )

    @model_validator(mode="after")
    def _embedding_needs_model(self):
        if self.dedup != "off" and self.dedup_method == "embedding" and not self.embedding_model:
            raise ValueError(
                "dedup_method 'embedding' needs embedding_model: a local encoder directory"
            )
        return self
