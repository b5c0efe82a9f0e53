"""The rollout worker loop: prompt job → N paths → ScoreBatch → scored group → ack.

Between jobs the worker checks the run's weight pointer and reloads the engine in place when
a newer version is published, so every path carries the version that produced it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

import grpc
from google.protobuf.message import DecodeError

from brorl import queue as q
from brorl import rpc, sampling
from brorl.v1 import common_pb2, reward_pb2
from services.rollout.explore.select import select
from services.rollout.samples import to_paths
from services.rollout.weight_sync import WeightSync

log = logging.getLogger(__name__)


@dataclass
class WorkerStats:
    paths_generated: int = 0
    tokens_generated: int = 0
    groups_published: int = 0
    reloads: int = 0


class RolloutWorker:
    def __init__(
        self,
        engine,
        engine_lock: threading.Lock,
        registry: q.RunRegistry,
        open_run: Callable[[str], q.RunChannels],
        reward_stub,
        *,
        run_id: str = "",
        claim_idle_ms: int = 30_000,
        reward_deadline_s: float = 120.0,
        weight_fetch_deadline_s: float = 60.0,
        stats: WorkerStats | None = None,
    ):
        """``registry`` says which run to follow (unless ``run_id`` fixes one); ``open_run``
        gives a run's channels (brorl.queue.RunChannels)."""
        self.engine = engine
        self.lock = engine_lock
        self.registry = registry
        self.open_run = open_run
        self.reward = reward_stub
        self.fixed_run_id = run_id
        self.claim_idle_ms = claim_idle_ms
        self.reward_deadline_s = reward_deadline_s
        self.stats = stats or WorkerStats()
        self.name = q.consumer_name()
        self._runs: dict[str, tuple[q.RunChannels, q.StreamQueue]] = {}
        # where the time between two jobs went (reported with the next group's stats)
        self._free_since = time.perf_counter()
        self._reload_s = 0.0
        self._publish_s = 0.0  # Redis write + ack of the previous group
        self.weights = WeightSync(engine, engine_lock, weight_fetch_deadline_s)

    def run(self, stop: threading.Event) -> None:
        log.info("worker %s started", self.name)
        while not stop.is_set():
            try:
                self.step()
            except Exception:  # noqa: BLE001 - keep the loop alive; the job stays pending and is retried
                log.exception("worker step failed; retrying in 2 s")
                stop.wait(2.0)

    def current_run(self) -> str:
        return self.fixed_run_id or self.registry.active()

    def _channels(self, run_id: str) -> tuple[q.RunChannels, q.StreamQueue]:
        """The run's channels and this worker's consumer of its prompt jobs."""
        if run_id not in self._runs:
            channels = self.open_run(run_id)
            queue = channels.prompt_queue(
                "rollout", consumer=self.name, claim_idle_ms=self.claim_idle_ms
            )
            self._runs[run_id] = (channels, queue)
        return self._runs[run_id]

    def step(self) -> bool:
        """Process at most one prompt job; False when there was nothing to do."""
        run_id = self.current_run()
        if not run_id:
            time.sleep(0.5)
            return False
        self.maybe_reload(run_id)
        channels, queue = self._channels(run_id)
        deliveries = queue.read(count=1, block_ms=500)
        for d in deliveries:
            with queue.lease(d.entry_id):  # a long job must not look like a dead worker's
                self.process(channels, queue, d)
        return bool(deliveries)

    def maybe_reload(self, run_id: str) -> None:
        """Serve the run's newest published version (services/rollout/weight_sync.py). Versions
        count per run: a worker that served another run before reloads even a lower version
        (every run publishes v0)."""
        pointer = self._channels(run_id)[0].read_weights()
        if pointer is None or self.weights.current(run_id, pointer):
            return
        start = time.perf_counter()
        if self.weights.sync(run_id, pointer):  # fetch + verify + apply, bounded by a deadline
            self.stats.reloads += 1
            log.info(
                "serving weight version %d after %.2fs",
                self.engine.weight_version,
                time.perf_counter() - start,
            )
        self._reload_s += time.perf_counter() - start

    @property
    def loaded_run(self) -> str:
        """The run whose published weights the engine holds ("" = the model directory)."""
        return self.weights.loaded_run

    def process(self, channels: q.RunChannels, queue: q.StreamQueue, delivery: q.Delivery) -> None:
        between = {  # since the previous job: publishing it, reloading weights, waiting for work
            "rollout/publish_s": self._publish_s,
            "rollout/reload_s": self._reload_s,
            "rollout/idle_s": max(time.perf_counter() - self._free_since - self._reload_s, 0.0),
            **{k: float(v) for k, v in self.weights.counts.items()},  # cumulative, this worker
        }
        self._reload_s = 0.0
        try:
            job = common_pb2.PromptJob.FromString(delivery.data)
        except DecodeError as exc:
            queue.dead_letter(delivery.entry_id, delivery.data, f"not a PromptJob: {exc}")
            return
        start = time.perf_counter()
        n_keep = job.sampling.n
        kwargs = sampling.effective(job.sampling).engine_kwargs()
        kwargs["n"] = sampling.candidates(job)  # hierarchical: M candidates, keep n
        try:
            with self.lock:
                version = self.engine.weight_version
                [(prompt_ids, samples)] = self.engine.generate([job.prompt], **kwargs)
                engine_phases = dict(getattr(self.engine, "last_phases", {}))
        except ValueError as exc:  # the engine refuses this prompt: retrying cannot help
            self.reject(channels, queue, delivery, job, str(exc))
            return
        gen_s = time.perf_counter() - start
        start = time.perf_counter()
        chosen = select(
            samples,
            n_keep,
            job.explore,
            lambda fn, idx, prefix: self.prefix_scores(job, samples, fn, idx, prefix),
        )
        paths = to_paths(
            [samples[i] for i in chosen.kept],
            group_id=job.group_id,
            prompt_id=job.prompt_id,
            version=version,
            sampling=job.sampling,
            worker=self.name,
            offset=job.path_offset,
            weights=[chosen.weights[i] for i in chosen.kept],
        )
        try:
            self.score(job, paths)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
                raise  # transient: the job stays pending and is retried / reclaimed
            queue.dead_letter(
                delivery.entry_id, delivery.data, f"reward service refused the job: {exc.details()}"
            )
            return
        score_s = time.perf_counter() - start
        group = common_pb2.PathGroup(
            run_id=channels.run_id,
            group_id=job.group_id,
            prompt_id=job.prompt_id,
            prompt=job.prompt,
            prompt_token_ids=prompt_ids,
            reference=job.reference,
            paths=paths,
            weight_version=version,
            worker=self.name,
            generate_seconds=gen_s,
            score_seconds=score_s,
            part_index=job.part_index,
            part_count=job.part_count,
            generated=len(samples),
            dropped=chosen.dropped,
            stats={**chosen.stats, **between, **engine_phases},
            eval=job.eval,
            extra=job.extra,
        )
        start = time.perf_counter()
        fresh = channels.publish_group(
            queue, delivery.entry_id, job.job_id, group.SerializeToString()
        )
        self._publish_s = time.perf_counter() - start
        self.stats.paths_generated += len(samples)
        self.stats.tokens_generated += sum(len(x.token_ids) for x in samples)
        self.stats.groups_published += int(fresh)
        self._free_since = time.perf_counter()
        log.info(
            "group %s: %d paths v%d gen %.2fs score %.2fs%s",
            job.group_id,
            len(paths),
            version,
            gen_s,
            score_s,
            "" if fresh else " (duplicate, dropped)",
        )

    def reject(self, channels, queue, delivery: q.Delivery, job, reason: str) -> None:
        """Answer a job the engine cannot take (e.g. a prompt longer than the context) at once
        with an empty group carrying the error, so the learner counts it and moves on."""
        group = common_pb2.PathGroup(
            run_id=channels.run_id,
            group_id=job.group_id,
            prompt_id=job.prompt_id,
            prompt=job.prompt,
            reference=job.reference,
            weight_version=self.engine.weight_version,
            worker=self.name,
            part_index=job.part_index,
            part_count=job.part_count,
            error=reason[:1000],
            eval=job.eval,
            extra=job.extra,
        )
        channels.publish_group(queue, delivery.entry_id, job.job_id, group.SerializeToString())
        self._free_since = time.perf_counter()
        log.warning("job %s refused by the engine: %s", job.job_id, reason)

    def prefix_scores(self, job, samples, reward_fn: str, indices: list[int], prefix_tokens: int):
        """Quality predictor: a reward function (e.g. a trained reward model) on path prefixes."""
        import numpy as np

        texts = [
            self.engine.decode(list(samples[i].token_ids)[:prefix_tokens])
            if prefix_tokens
            else samples[i].text
            for i in indices
        ]
        request = reward_pb2.ScoreBatchRequest(
            reward_fn=reward_fn,
            items=[
                reward_pb2.ScoreRequest(
                    id=str(i),
                    prompt=job.prompt,
                    completion=t,
                    reference=job.reference,
                    extra=job.extra,
                )
                for i, t in zip(indices, texts)
            ],
        )
        return np.array([r.reward for r in self._call_reward(request).results], dtype=np.float64)

    def score(self, job: common_pb2.PromptJob, paths: list[common_pb2.Path]) -> None:
        if not paths:
            return
        for path, result in zip(paths, self._score_with(job.reward_fn, job, paths)):
            path.reward = result.reward
            path.reward_status = result.status
            path.reward_components.update(result.components)
        if job.verifier_fn:
            self.verify(job, paths)

    def verify(self, job: common_pb2.PromptJob, paths: list[common_pb2.Path]) -> None:
        """The run's held-out verifier on its sample of the paths (the learner's reward-hacking
        monitor compares it with the training reward; it never enters the update)."""
        sample = [p for p in paths if sampling.verifies(p.path_id, job.verifier_sample)]
        for path, result in zip(sample, self._score_with(job.verifier_fn, job, sample)):
            path.verifier_reward = result.reward
            path.verifier_status = result.status or "ok"

    def _score_with(self, reward_fn: str, job, paths: list[common_pb2.Path]) -> list:
        if not paths:
            return []
        request = reward_pb2.ScoreBatchRequest(
            reward_fn=reward_fn,
            items=[
                reward_pb2.ScoreRequest(
                    id=p.path_id,
                    prompt=job.prompt,
                    completion=p.text,
                    reference=job.reference,
                    extra=job.extra,
                )
                for p in paths
            ],
        )
        return list(self._call_reward(request).results)

    def _call_reward(self, request):
        return rpc.call_with_retry(self.reward.ScoreBatch, request, timeout=self.reward_deadline_s)
