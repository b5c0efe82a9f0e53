"""The learner's training loop, as one narrative (``Trainer.run``):

  feed prompt jobs (bounded in flight) → collect a step's scored groups (reassembled,
  deduplicated, stale and all-equal ones dropped) → update the policy → ack → publish a weight
  version every K steps → checkpoint → emit the step's metrics.

Everything it touches is injected: the run's Redis channels and registry (brorl.queue), the
weight store, and a factory of the policy (DeepSpeed in production), so a unit test can drive
the loop with an in-memory queue and a small policy.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from brorl.queue import RunChannels, RunRegistry
from brorl.runconfig import RunConfig
from brorl.weights import WeightStore
from services.learner.intake import GroupIntake
from services.learner.jobfeed import JobFeed
from services.learner.prompts import load_prompts
from services.learner.publish import publish_version
from services.learner.runstate import RunState
from services.learner.step_metrics import RunCounters, step_metrics

log = logging.getLogger(__name__)


class Trainer:
    def __init__(
        self,
        run_id: str,
        cfg: RunConfig,
        state: RunState,
        channels: RunChannels,
        registry: RunRegistry,
        store: WeightStore,
        build_policy: Callable[[], object],
        *,
        keep_versions: int = 3,
        resume: bool = False,
    ):
        self.run_id, self.cfg, self.state, self.channels = run_id, cfg, state, channels
        self.registry, self.store, self.build_policy = registry, store, build_policy
        self.keep_versions, self.resume = keep_versions, resume
        self.feed = JobFeed(
            run_id, cfg, load_prompts(cfg.data.train_path), channels.prompt_queue("rollout")
        )
        self.ckpt_dir = state.run_dir / "checkpoints"
        self.counters = RunCounters()
        self.step = 0
        self.version = 0

    def run(self) -> None:
        self.start()
        train, stop = self.cfg.train, self.state.stop_requested
        while self.step < train.steps and not stop.is_set():
            t0 = time.perf_counter()
            self.feed.top_up(self.intake.consumed, self.step)
            intake = self.intake.collect(train.groups_per_step, self.version, stop)
            if intake is None:
                break  # stop requested while waiting
            t1 = time.perf_counter()
            update = self.policy.update(intake.groups)
            self.intake.ack(intake.entries)
            self.step += 1
            t2 = time.perf_counter()
            if self.step % self.cfg.asynchrony.publish_every == 0:
                self.publish()
            if self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
                self.checkpoint()
            self._serve_checkpoint_request()
            self.counters.add(intake)
            metrics = step_metrics(intake, update, self.counters)
            t3 = time.perf_counter()
            metrics.update(
                {
                    "learner/step_s": t3 - t0,
                    "learner/wait_s": t1 - t0,
                    "learner/update_s": t2 - t1,
                    "learner/publish_s": t3 - t2,
                    "learner/weight_version": self.version,
                }
            )
            self.state.step, self.state.weight_version = self.step, self.version
            self.state.emit(metrics)
        self.finish()

    # -- start and end ------------------------------------------------------------------------
    def start(self) -> None:
        self.policy = self.build_policy()
        self.intake = GroupIntake(
            self.channels.path_queue(claim_idle_ms=2**31 - 1),
            self.cfg.asynchrony,
            on_consumed=lambda: self.feed.top_up(self.intake.consumed, self.step),
        )
        if self.resume:
            self._restore()
        else:
            # Version 0 is the initial policy, published so that workers which served another
            # run before load it rather than keep that run's weights.
            self.version = -1
            self.publish()
        self.registry.announce(self.run_id)
        self.state.emit({"learner/weight_version": self.version}, event="start")

    def finish(self) -> None:
        self.checkpoint()
        self.policy.export(self.state.run_dir / "final")
        self.registry.retire(self.run_id)

    # -- weights and checkpoints ----------------------------------------------------------------
    def publish(self) -> None:
        self.version += 1
        publish_version(
            self.policy.save_weights, self.store, self.channels, self.version, self.step
        )
        self.store.prune(self.keep_versions)

    def checkpoint(self) -> str:
        tag = f"step{self.step:07d}"
        self.policy.save_checkpoint(
            str(self.ckpt_dir),
            tag,
            {
                "step": self.step,
                "version": self.version,
                "cursor": self.feed.cursor,
                "consumed": self.intake.consumed,
                "seen": sorted(self.intake.seen),
                "counters": dict(self.counters.counts),
            },
        )
        log.info("checkpoint %s written", tag)
        self.state.last_checkpoint = (str(self.ckpt_dir / tag), self.step)
        return str(self.ckpt_dir / tag)

    def _serve_checkpoint_request(self) -> None:
        if self.state.checkpoint_requested.is_set():
            self.checkpoint()
            self.state.checkpoint_requested.clear()
            with self.state.checkpoint_done:
                self.state.checkpoint_done.notify_all()

    def _restore(self) -> None:
        client = self.policy.load_checkpoint(str(self.ckpt_dir))
        self.step, self.version = client["step"], client["version"]
        self.feed.cursor, self.intake.consumed = client["cursor"], client["consumed"]
        self.intake.seen = set(client["seen"])
        self.counters = RunCounters(client.get("counters", {}))
        # Rollout workers may hold any version: republish the restored weights as a new one.
        self.publish()
        log.info(
            "resumed at step %d (cursor %d, now weight version %d)",
            self.step,
            self.feed.cursor,
            self.version,
        )
