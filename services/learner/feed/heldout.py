"""Held-out evaluation during a run (``eval_every``): a round sends one greedy prompt job per
held-out prompt through the same rollout workers and reward function as training, marked
``eval`` so that the intake hands the scored groups here instead of training on them.

A round's metrics are emitted once all its groups arrived, or after ``timeout_s`` with the ones
that did (``eval/missing`` counts the rest): ``eval/accuracy`` is the share of held-out prompts
whose greedy completion got the full reward (>= 1), ``eval/reward_mean`` the mean reward,
``eval/weight_version`` the newest weights that sampled the round, and with ``data.fields.stratum``
``eval/accuracy/<stratum>`` per stratum of the held-out prompts; a group whose path could not
be sampled or scored counts in ``eval/failed``, not as a zero. Records carry the step the round
was started at.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from brorl.contract import RewardStatus
from brorl import sampling
from brorl.config.run import RunConfig
from brorl.v1 import common_pb2
from services.learner.feed import ids
from services.learner.feed.prompts import Prompt

log = logging.getLogger(__name__)


@dataclass
class Round:
    step: int
    started: float  # time.monotonic()
    pending: set[str]  # group ids not yet scored
    strata: dict[str, str]  # group id → its prompt's stratum ('': none)
    rewards: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    scored_strata: list[str] = field(default_factory=list)  # beside rewards
    failed: int = 0  # groups whose path could not be sampled or scored


def round_metrics(
    rewards: list[float],
    versions: list[int],
    missing: int,
    failed: int = 0,
    strata: list[str] | None = None,
) -> dict[str, float]:
    """The metrics of one evaluation round from its greedy paths' rewards; ``strata`` (beside
    ``rewards``) adds eval/accuracy/<stratum> and eval/prompts/<stratum> for every named one."""
    n = len(rewards)
    out = {
        "eval/failed": float(failed),
        "eval/accuracy": sum(r >= 1.0 for r in rewards) / n if n else 0.0,
        "eval/reward_mean": sum(rewards) / n if n else 0.0,
        "eval/prompts": float(n),
        "eval/missing": float(missing),
        "eval/weight_version": float(max(versions, default=0)),
    }
    for name in sorted(set(strata or ()) - {""}):
        mine = [r for r, s in zip(rewards, strata) if s == name]
        out[f"eval/accuracy/{name}"] = sum(r >= 1.0 for r in mine) / len(mine)
        out[f"eval/prompts/{name}"] = float(len(mine))
    return out


class HeldoutEval:
    def __init__(
        self,
        run_id: str,
        cfg: RunConfig,
        prompts: list[Prompt],
        queue,
        epoch: str,
        emit: Callable[[int, dict[str, float]], None],
        timeout_s: float,
        env: common_pb2.EnvironmentParams | None = None,
    ):
        """``env``: the jobs' EnvironmentParams (RunPrompts.env; default: from ``cfg.env``)."""
        self.run_id, self.cfg, self.prompts, self.queue = run_id, cfg, prompts, queue
        self.epoch, self.emit, self.timeout_s = epoch, emit, timeout_s
        self.env = env if env is not None else sampling.environment_params(cfg.env)
        self.rounds: dict[int, Round] = {}
        self.owner: dict[str, int] = {}  # group id → the step of its round

    @property
    def enabled(self) -> bool:
        return bool(self.prompts)

    @property
    def busy(self) -> bool:
        return bool(self.rounds)

    def due(self, step: int) -> bool:
        """A round is due at the start, every ``eval_every`` steps and at the last step."""
        every, last = self.cfg.eval_every, self.cfg.train.steps
        return self.enabled and (step in (0, last) or bool(every and step % every == 0))

    def start(self, step: int) -> None:
        """Enqueue one greedy job per held-out prompt, for the round of ``step``."""
        if step in self.rounds:
            return
        params = sampling.eval_sampling(self.cfg.sampling)
        pending, strata = set(), {}
        for i, prompt in enumerate(self.prompts):
            group_id = ids.eval_group_id(step, i)
            job = common_pb2.PromptJob(
                run_id=self.run_id,
                job_id=ids.eval_job_id(self.run_id, self.epoch, group_id),
                group_id=group_id,
                prompt_id=ids.eval_prompt_id(i),
                prompt=prompt.text,
                prompt_token_ids=prompt.token_ids,
                env=self.env,
                reference=prompt.reference,
                extra=prompt.extra,
                sampling=params,
                reward_fn=self.cfg.reward_fn,
                learner_step=step,
                eval=True,
            )
            self.queue.put(job.SerializeToString())
            pending.add(group_id)
            strata[group_id] = prompt.stratum
            self.owner[group_id] = step
        self.rounds[step] = Round(step, time.monotonic(), pending, strata)

    def take(self, group: common_pb2.PathGroup) -> None:
        """A scored evaluation group from the intake (duplicates and strays are ignored)."""
        step = self.owner.pop(group.group_id, None)
        r = self.rounds.get(step) if step is not None else None
        if r is None or group.group_id not in r.pending:
            return
        r.pending.discard(group.group_id)
        scored = ("", RewardStatus.OK)
        ok = [p for p in group.paths if p.reward_status in scored and not group.error]
        if ok:
            r.rewards.append(ok[0].reward)
            r.versions.append(group.weight_version)
            r.scored_strata.append(r.strata.get(group.group_id, ""))
        else:  # a failed evaluation is not a zero reward
            r.failed += 1
        if not r.pending:
            self._close(r)

    def poll(self) -> None:
        """Close rounds that waited longer than ``timeout_s`` with what arrived."""
        now = time.monotonic()
        for r in [r for r in self.rounds.values() if now - r.started > self.timeout_s]:
            log.warning("evaluation round of step %d: %d groups never came", r.step, len(r.pending))
            self._close(r)

    def _close(self, r: Round) -> None:
        del self.rounds[r.step]
        for group_id in r.pending:
            self.owner.pop(group_id, None)
        metrics = round_metrics(r.rewards, r.versions, len(r.pending), r.failed, r.scored_strata)
        log.info(
            "held-out evaluation at step %d: accuracy %.3f over %d prompts",
            r.step,
            metrics["eval/accuracy"],
            len(r.rewards),
        )
        self.emit(r.step, metrics)
