"""An engine call's tail: each job's paths selected, the call's paths scored together, each job's
group published (which acks the job).

``CallFinisher`` runs it wherever it is handed a call's ``Sampled`` jobs: in the worker's loop
(``overlap_tail: false``), on its tail thread (runners.py) or in a process of its own
(process.py); it needs no engine, only the reward service, Redis and,
for explore's prefix scoring, the model's tokenizer (``decode``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from brorl import queue as q
from brorl.v1 import common_pb2
from services.rollout import groups
from services.rollout.explore.select import Selection, select
from services.rollout.samples import to_paths
from services.rollout.scoring import RewardCalls

log = logging.getLogger(__name__)


# the stats a call's first group carries for the whole call (its later groups carry 0)
PER_CALL = ("rollout/reload_s", "rollout/idle_s", "rollout/tail_wait_s", "rollout/version_wait_s")


@dataclass
class WorkerStats:
    paths_generated: int = 0
    tokens_generated: int = 0
    groups_published: int = 0
    reloads: int = 0


@dataclass(frozen=True)
class Claimed:
    """A job this worker holds: its run's channels, the queue it came from, the delivery, and the
    lease's set of held entries (StreamQueue.lease)."""

    channels: q.RunChannels
    queue: q.StreamQueue
    delivery: q.Delivery
    held: set = field(default_factory=set)

    def release(self) -> None:
        """Stop renewing the entry: it is about to be acked (published or dead-lettered)."""
        self.held.discard(self.delivery.entry_id)

    def dead_letter(self, reason: str) -> None:
        self.release()
        self.queue.dead_letter(self.delivery.entry_id, self.delivery.data, reason)


class RunConsumers:
    """Each run's channels and one consumer's queue of its prompt jobs, opened at first use: the
    worker's loop and its tail process (process.py) open them alike, each with its own Redis."""

    def __init__(self, open_run: Callable[[str], q.RunChannels], consumer: str, claim_idle_ms: int):
        self.open_run, self.consumer, self.claim_idle_ms = open_run, consumer, claim_idle_ms
        self._runs: dict[str, tuple[q.RunChannels, q.StreamQueue]] = {}

    def __call__(self, run_id: str) -> tuple[q.RunChannels, q.StreamQueue]:
        if run_id not in self._runs:
            channels = self.open_run(run_id)
            queue = channels.prompt_queue(consumer=self.consumer, claim_idle_ms=self.claim_idle_ms)
            self._runs[run_id] = (channels, queue)
        return self._runs[run_id]

    def opened(self, run_id: str) -> q.RunChannels | None:
        """The run's channels if they are open already (the weights watch opens none)."""
        return self._runs[run_id][0] if run_id in self._runs else None


@dataclass
class Generated:
    """What one engine call gave for a job."""

    version: int  # the weight version that sampled it
    prompt_ids: list[int]  # the prompt's token ids as sampled from
    samples: list  # engine Samples (services/rollout/engine.py) or episodes (episodes.py)
    phases: dict[str, float] = field(default_factory=dict)  # the engine's own time breakdown
    seconds: dict[str, float] = field(default_factory=dict)  # generate / score wall-clock


# One job of a call: (claim, job) and what the engine gave, or its refusal of the prompt.
Sampled = tuple[tuple[Claimed, common_pb2.PromptJob], "Generated | ValueError"]


class CallFinisher:
    """Selects, scores and publishes a call's groups as ``name`` (the worker's consumer name)."""

    def __init__(
        self,
        rewards: RewardCalls,
        name: str,
        decode: Callable[[list[int]], str],
        stats: WorkerStats | None = None,
    ):
        self.rewards, self.name, self.decode = rewards, name, decode
        self.stats = stats or WorkerStats()
        self.publish_s = 0.0  # Redis write + ack of the last group

    def finish(self, sampled: list[Sampled], between: dict[str, float], version: int) -> None:
        """A call's jobs: a refused prompt is published as an error group (with ``version``, the
        weights that refused it); the others selected, scored together, then published."""
        ready = []  # (claim, job, gen, chosen, paths) of the jobs the engine sampled
        for (claim, job), gen in sampled:
            if isinstance(gen, ValueError):  # the engine refuses this prompt: retrying cannot help
                self.publish(claim, job, self.error_group(claim, job, str(gen), version))
            else:
                chosen = self.select(job, gen)
                ready.append((claim, job, gen, chosen, self.paths(job, gen, chosen)))
        for (claim, job, gen, chosen, paths), scored in zip(ready, self.rewards.score_all(ready)):
            if scored:  # else refused: dead-lettered
                self.publish(claim, job, self.group(claim, job, gen, chosen, paths, between))
            # the jobs after the first of a call waited for nothing but the call itself
            between = {**between, "rollout/publish_s": self.publish_s}
            between.update({k: 0.0 for k in PER_CALL})

    def close(self) -> None:
        """Nothing to stop here (TailProcess stops its child)."""

    def select(self, job: common_pb2.PromptJob, gen: Generated) -> Selection:
        """Which candidates the group keeps, with their weights (services/rollout/explore/);
        every episode is kept (exploration selects among single completions)."""
        if job.env.address:
            every = range(len(gen.samples))
            return Selection(list(every), {i: 1.0 for i in every})

        def prefix_scores(reward_fn: str, indices: list[int], prefix_tokens: int):
            texts = {
                i: self.decode(list(gen.samples[i].token_ids)[:prefix_tokens])
                if prefix_tokens
                else gen.samples[i].text
                for i in indices
            }
            return np.array(self.rewards.prefix_scores(job, texts, reward_fn), dtype=np.float64)

        return select(gen.samples, job.sampling.n, job.explore, prefix_scores)

    def paths(self, job, gen: Generated, chosen: Selection) -> list[common_pb2.Path]:
        return to_paths(
            [gen.samples[i] for i in chosen.kept],
            group_id=job.group_id,
            prompt_id=job.prompt_id,
            version=gen.version,
            sampling=job.sampling,
            worker=self.name,
            offset=job.path_offset,
            weights=[chosen.weights[i] for i in chosen.kept],
        )

    def group(self, claim: Claimed, job, gen: Generated, chosen: Selection, paths, between):
        common = groups.fields(claim.channels.run_id, job, gen.version, self.name)
        return groups.scored(common, gen, chosen, paths, between)

    def error_group(self, claim: Claimed, job, reason: str, version: int) -> common_pb2.PathGroup:
        common = groups.fields(claim.channels.run_id, job, version, self.name)
        return groups.refused(common, reason)

    def publish(self, claim: Claimed, job, group: common_pb2.PathGroup) -> None:
        """Publish the group once per job id and ack the job, atomically (brorl.queue)."""
        start = time.perf_counter()
        data = group.SerializeToString()
        claim.release()
        fresh = claim.channels.publish_group(claim.queue, claim.delivery.entry_id, job.job_id, data)
        self.publish_s = time.perf_counter() - start
        if group.error:
            log.warning("job %s refused by the engine: %s", job.job_id, group.error)
            return
        self.stats.groups_published += int(fresh)
        log.info(
            "group %s: %d paths v%d gen %.2fs score %.2fs%s",
            job.group_id,
            len(group.paths),
            group.weight_version,
            group.generate_seconds,
            group.score_seconds,
            "" if fresh else " (duplicate, dropped)",
        )
