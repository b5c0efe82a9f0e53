"""The learner's job feed: keeps up to ``max_inflight_groups`` groups enqueued but not yet
consumed, sent a step's groups at a time (``JobFeed.top_up``). A group is one prompt job, or
several parts when ``sampling.max_paths_per_job`` fans it out over workers; what each job asks
the workers for is decided by ``brorl.sampling``.

How many paths a group gets is ``sampling.budget``'s: ``uniform`` gives every group
``sampling.n``; ``adaptive`` splits ``total`` paths over each block of ``train.groups_per_step``
consecutive groups (the groups one step takes when none is dropped) by the pass rate of each
block's prompts (``PassRates``, estimated from their past groups), with
``services.learner.feed.budget.allocate``. A block is allocated once, when its first group is sent,
from the pass rates known then."""

from __future__ import annotations

from brorl import sampling
from brorl.config.run import AdaptiveBudget, RunConfig
from brorl.v1 import common_pb2
from services.learner.feed import budget, ids
from services.learner.feed.lookahead import LearnerAt, min_weight_version
from services.learner.feed.prompts import Prompt, PromptOrder


class PassRates:
    """Successes and paths seen per prompt index (checkpointed with the run). A path is a
    success when its reward is at least ``success_reward``."""

    def __init__(self, success_reward: float, counts: dict | None = None):
        self.success_reward = success_reward
        # prompt index -> [successes, paths]; JSON keys come back as strings
        self.counts: dict[int, list[int]] = {int(k): list(v) for k, v in (counts or {}).items()}

    def record(self, group: common_pb2.PathGroup) -> None:
        """Count a consumed group's paths (dropped groups too: an all-equal group is exactly
        what says a prompt is solved or hopeless). Groups not from this feed are ignored."""
        if not group.paths or not group.prompt_id.startswith("p"):
            return
        entry = self.counts.setdefault(ids.prompt_index(group.prompt_id), [0, 0])
        entry[0] += sum(p.reward >= self.success_reward for p in group.paths)
        entry[1] += len(group.paths)

    def estimate(self, index: int) -> float:
        """Posterior mean pass rate (uniform prior: 0.5 for a prompt never seen)."""
        successes, trials = self.counts.get(index, (0, 0))
        return budget.pass_rate_estimate(successes, trials)

    def state(self) -> dict:
        return {str(k): v for k, v in self.counts.items()}


class JobFeed:
    """``epoch`` names this learner process's jobs: the workers publish a job id once, so a
    learner resumed from a checkpoint re-sends the groups it lost under new job ids."""

    def __init__(
        self, run_id: str, cfg: RunConfig, prompts: list[Prompt], queue, epoch: str, env=None
    ):
        """``env``: the jobs' EnvironmentParams (RunPrompts.env; default: from ``cfg.env``)."""
        self.run_id, self.cfg, self.prompts, self.queue = run_id, cfg, prompts, queue
        self.epoch = epoch
        self.env = env if env is not None else sampling.environment_params(cfg.env)
        self.order = PromptOrder(len(prompts), cfg.data.shuffle_seed)
        self.cursor = 0  # groups enqueued so far (checkpointed)
        b = cfg.sampling.budget
        self.pass_rates = PassRates(b.success_reward if isinstance(b, AdaptiveBudget) else 1.0)
        self._blocks: dict[int, list[int]] = {}  # block -> paths per group (adaptive budget)

    def budget_state(self) -> dict:
        """What a checkpoint keeps of the budget: the pass-rate counts and the blocks already
        allocated (a group re-sent after a resume keeps the n its first jobs had, so parts of
        both sendings fit together)."""
        blocks = {str(b): n for b, n in self._blocks.items()}
        return {"pass_rates": self.pass_rates.state(), "blocks": blocks}

    def restore_budget(self, state: dict) -> None:
        self.pass_rates = PassRates(self.pass_rates.success_reward, state.get("pass_rates"))
        self._blocks = {int(b): list(n) for b, n in state.get("blocks", {}).items()}

    def stratum_of(self, group: common_pb2.PathGroup) -> str:
        """The stratum (data.fields.stratum) of the prompt a group of this feed answers; '' for
        none and for a group from elsewhere (a held-out round's)."""
        pid = group.prompt_id
        if not (pid.startswith("p") and pid[1:].isdigit()):
            return ""
        index = int(pid[1:])
        return self.prompts[index].stratum if index < len(self.prompts) else ""

    def top_up(self, consumed: int, at: LearnerAt) -> None:
        """Enqueue groups until ``max_inflight_groups`` are in flight (enqueued − ``consumed``),
        once at least a block of them (``block``) can go, all in one transaction. A worker
        waiting for jobs then wakes to a step's groups together and samples them in one engine
        call; sent one per consumed group, each went to an idle worker alone, and a step's
        groups came from different calls (docs/performance.md, "A step's jobs sent together").
        Each job names the oldest weight version it may be sampled with; a group whose version
        is not made yet stays here until it is (feed/lookahead.py)."""
        most = self.cfg.asynchrony.max_inflight_groups
        if most - (self.cursor - consumed) < self.block:
            return
        jobs: list[bytes] = []
        cursor = self.cursor
        while cursor - consumed < most:
            oldest = min_weight_version(at, cursor - consumed, self.cfg)
            if oldest is None:
                break  # would be stale if sampled now: goes once its version is made
            jobs += self.jobs(cursor, at.step, oldest)
            cursor += 1
        if not jobs:
            return
        self.queue.put_many(jobs)
        self.cursor = cursor  # only once they are enqueued: a failed put is retried whole

    @property
    def block(self) -> int:
        """Groups the feed sends at once: a step's (``train.groups_per_step``), or half the
        in-flight bound where that is less, so that the workers never wait for a block."""
        return max(
            1, min(self.cfg.train.groups_per_step, self.cfg.asynchrony.max_inflight_groups // 2)
        )

    def group_size(self, cursor: int) -> int:
        """Paths of group ``g<cursor>`` under ``sampling.budget`` (module docstring)."""
        b = self.cfg.sampling.budget
        if not isinstance(b, AdaptiveBudget):
            return self.cfg.sampling.n
        k = self.cfg.train.groups_per_step
        block = cursor // k
        if block not in self._blocks:
            cursors = range(block * k, (block + 1) * k)
            rates = [self.pass_rates.estimate(self.order[c]) for c in cursors]
            self._blocks[block] = budget.allocate(rates, b.total, b.n_min, b.n_max, b.objective)
            for old in [o for o in self._blocks if o < block - 64]:  # stays small
                del self._blocks[old]
        return self._blocks[block][cursor - block * k]

    def send(self, cursor: int, step: int) -> None:
        """Enqueue the jobs of group ``g<cursor>``."""
        self.queue.put_many(self.jobs(cursor, step))

    def jobs(self, cursor: int, step: int, min_version: int = 0) -> list[bytes]:
        """The serialized PromptJobs of group ``g<cursor>`` (one per part), to be sampled with
        weights of at least ``min_version``."""
        index = self.order[cursor]
        prompt = self.prompts[index]
        n = self.group_size(cursor)
        out = []
        for part in sampling.job_parts(self.cfg.sampling, self.cfg.explore, step, n=n):
            job = common_pb2.PromptJob(
                run_id=self.run_id,
                job_id=ids.job_id(self.run_id, self.epoch, cursor, part.index),
                group_id=ids.group_id(cursor),
                prompt_id=ids.prompt_id(index),
                prompt=prompt.text,
                prompt_token_ids=prompt.token_ids,
                env=self.env,
                reference=prompt.reference,
                extra=prompt.extra,
                reward_fn=self.cfg.reward_fn,
                verifier_fn=self.cfg.monitors.verifier_fn,
                verifier_sample=self.cfg.monitors.verifier_sample,
                learner_step=step,
                min_weight_version=min_version,
                part_index=part.index,
                part_count=part.count,
                path_offset=part.path_offset,
                explore=part.explore,
                sampling=part.sampling,
            )
            out.append(job.SerializeToString())
        return out
