"""The sampling contract between the learner and the rollout workers, in one place.

Importance ratios are right only when the learner scores a path under the same distribution
the worker sampled it from. Both sides therefore go through this module:

* the learner's job feed turns a run config + step into the ``SamplingParams`` and
  ``ExploreParams`` of each prompt job (``job_parts``): the fan-out into parts and the
  oversampling share of each part are decided here;
* the worker turns a received ``SamplingParams`` into engine arguments
  (``effective(...).engine_kwargs()``) and samples ``candidates(job)`` paths;
* the learner turns the ``SamplingParams`` each path carries back into the temperature,
  top-k and top-p it scores log-probs with (``effective(...)``).

Proto3 cannot tell "unset" from zero, so a zero field means the default named here.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

from brorl.v1 import common_pb2

# What a zero (unset) field of a received SamplingParams / ExploreParams means.
DEFAULT_MAX_TOKENS = 16
DEFAULT_DEDUP_THRESHOLD = 0.8
DEFAULT_PREDICTOR = "logprob"
DEFAULT_DEDUP_METHOD = "minhash"
TOP_K_OFF = -1
TOP_P_OFF = 1.0


@dataclass(frozen=True)
class EffectiveSampling:
    """The sampling distribution a ``SamplingParams`` stands for, defaults resolved."""

    n: int
    temperature: float  # 0: greedy
    top_k: int  # TOP_K_OFF or >= 1
    top_p: float  # in (0, 1]; TOP_P_OFF disables
    max_tokens: int
    seed: int | None
    stop: tuple[str, ...]

    @property
    def logprob_temperature(self) -> float:
        """Temperature the learner scores log-probs at: greedy paths are scored at 1."""
        return self.temperature if self.temperature > 0 else 1.0

    @property
    def truncated(self) -> bool:
        return self.top_k != TOP_K_OFF or self.top_p < TOP_P_OFF

    def engine_kwargs(self) -> dict:
        """Keyword arguments of ``RolloutEngine.generate``."""
        return dict(
            n=self.n,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            max_tokens=self.max_tokens,
            seed=self.seed,
            stop=list(self.stop) or None,
        )


def effective(s: common_pb2.SamplingParams) -> EffectiveSampling:
    return EffectiveSampling(
        n=s.n,
        temperature=float(s.temperature),
        top_k=s.top_k if s.top_k > 0 else TOP_K_OFF,
        top_p=float(s.top_p) if 0 < s.top_p < 1 else TOP_P_OFF,
        max_tokens=s.max_tokens or DEFAULT_MAX_TOKENS,
        seed=s.seed or None,
        stop=tuple(s.stop),
    )


@dataclass(frozen=True)
class EffectiveExplore:
    """Exploration settings of one prompt job, defaults resolved (see ExploreParams)."""

    oversample_m: int  # 0: off
    dedup: str  # off | keep_one | downweight
    dedup_method: str
    dedup_threshold: float
    embedding_model: str
    retention: float  # 1: off
    predictor: str
    predictor_prefix_tokens: int  # 0: the whole path


def effective_explore(e: common_pb2.ExploreParams) -> EffectiveExplore:
    return EffectiveExplore(
        oversample_m=e.oversample_m,
        dedup=e.dedup or "off",
        dedup_method=e.dedup_method or DEFAULT_DEDUP_METHOD,
        dedup_threshold=e.dedup_threshold or DEFAULT_DEDUP_THRESHOLD,
        embedding_model=e.embedding_model,
        retention=e.retention if 0 < e.retention < 1 else 1.0,
        predictor=e.predictor or DEFAULT_PREDICTOR,
        predictor_prefix_tokens=e.predictor_prefix_tokens,
    )


def candidates(job: common_pb2.PromptJob) -> int:
    """Paths a worker samples for ``job``: n, or M >= n when oversampling keeps the best n."""
    return max(job.explore.oversample_m, job.sampling.n)


def part_sizes(n: int, max_paths_per_job: int) -> list[int]:
    """A group of ``n`` paths fanned out into jobs of at most ``max_paths_per_job`` (0: one)."""
    per_job = max_paths_per_job or n
    return [min(per_job, n - offset) for offset in range(0, n, per_job)]


def part_oversample(oversample_m: int, part: int, n: int) -> int:
    """A part's share of the group's M candidates (each part keeps its share of n)."""
    if not oversample_m:
        return 0
    return max(math.ceil(oversample_m * part / n), part)


@dataclass(frozen=True)
class JobPart:
    index: int
    count: int
    path_offset: int  # the part's first path index within the group
    sampling: common_pb2.SamplingParams
    explore: common_pb2.ExploreParams


def job_parts(sampling_cfg, explore_cfg, step: int, n: int | None = None) -> list[JobPart]:
    """The prompt jobs of one group at learner ``step``, from a run config's ``sampling`` and
    ``explore`` sections (``brorl.config.run.SamplingConfig`` / ``ExploreConfig``). ``n``: the
    group's paths when a per-prompt budget sets them (``sampling.budget``), else ``sampling.n``;
    fan-out and the oversampling share follow the group's own n."""
    s, e = sampling_cfg, explore_cfg
    n = s.n if n is None else n
    if n < 1:
        raise ValueError(f"a group needs at least 1 path, got n={n}")
    sizes = part_sizes(n, s.max_paths_per_job)
    per_job = sizes[0]
    return [
        JobPart(
            index=i,
            count=len(sizes),
            path_offset=i * per_job,
            sampling=common_pb2.SamplingParams(
                n=size,
                temperature=s.temperature_at(step),
                top_k=s.top_k,
                top_p=s.top_p,
                max_tokens=s.max_tokens,
                stop=s.stop,
            ),
            explore=common_pb2.ExploreParams(
                oversample_m=part_oversample(e.oversample_m, size, n),
                dedup=e.dedup,
                dedup_threshold=e.dedup_threshold,
                dedup_method=e.dedup_method,
                embedding_model=e.embedding_model,
                retention=e.retention,
                predictor=e.predictor,
                predictor_prefix_tokens=e.predictor_prefix_tokens,
            ),
        )
        for i, size in enumerate(sizes)
    ]


def eval_sampling(sampling_cfg) -> common_pb2.SamplingParams:
    """A held-out evaluation job's sampling: one greedy path, the run's length and stop strings
    (``brorl.config.run.SamplingConfig``)."""
    return common_pb2.SamplingParams(
        n=1,
        temperature=0.0,
        top_k=TOP_K_OFF,
        top_p=TOP_P_OFF,
        max_tokens=sampling_cfg.max_tokens,
        stop=sampling_cfg.stop,
    )


def verifies(path_id: str, share: float) -> bool:
    """Whether the held-out verifier scores this path (a job's ``verifier_sample``; 0 reads as
    all). A hash of the path id, so every worker and every retry picks the same paths, and the
    choice is independent of the path's text or reward."""
    if share <= 0 or share >= 1:
        return True
    return zlib.crc32(path_id.encode()) / 2**32 < share


def environment_params(env_cfg, chat_turn=None) -> common_pb2.EnvironmentParams:
    """What a job of a run with an ``env`` section (``brorl.config.environment``) asks of the
    rollout worker's episodes; an empty message (single-turn paths) without one. ``chat_turn``:
    the observation's chat wrapping when ``env.chat`` (the learner derives it from the model's
    chat template)."""
    if env_cfg is None:
        return common_pb2.EnvironmentParams()
    return common_pb2.EnvironmentParams(
        address=env_cfg.address,
        max_turns=env_cfg.max_turns,
        max_total_tokens=env_cfg.max_total_tokens,
        step_timeout_s=env_cfg.step_timeout_s,
        episode_timeout_s=env_cfg.episode_timeout_s,
        max_inflight_steps=env_cfg.max_inflight_steps,
        reward=env_cfg.reward,
        chat=env_cfg.chat,
        chat_turn=chat_turn,
    )
