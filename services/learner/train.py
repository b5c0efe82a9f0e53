"""The learner's training loop, as one narrative (``Trainer.run``):

  feed prompt jobs (bounded in flight) → collect a step's scored groups (reassembled,
  deduplicated, stale and all-equal ones dropped) → update the policy → ack → publish a weight
  version every K steps → checkpoint → emit the step's metrics.

An update skipped for a non-finite loss or gradient does not count as a step (its groups are
acked and counted); ``train.max_skipped_steps`` in a row fail the run. Every Redis call is
retried while Redis is down, for up to ``async.redis_outage_s``. Resuming from a checkpoint
re-sends, under this process's new job-id epoch, exactly the groups that were in flight when the
checkpoint was written (docs/reliability.md).

Everything it touches is injected: the run's Redis channels and registry (brorl.queue), the
weight store, and a factory of the policy (DeepSpeed in production), so a unit test can drive
the loop with an in-memory queue and a small policy.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections import deque
from typing import Callable

import numpy as np
import torch

from brorl.queue import RunChannels, RunRegistry, retry_while_down
from brorl.streams import NEVER_RECLAIM_MS
from brorl.config.run import RunConfig
from brorl.sampling import DEFAULT_MAX_TOKENS
from brorl.weights.store import WeightStore
from services.learner.algo.downsample import keep_paths
from services.learner.intake.dead_letters import DeadLetterWatch
from services.learner.cores import CoreBorrowing
from services.learner.feed.heldout import HeldoutEval
from services.learner.guard.actions import RunGuard
from services.learner.intake.collect import GroupIntake
from services.learner.feed.jobfeed import JobFeed
from services.learner.feed.lookahead import LearnerAt
from services.learner.model.layer_hooks import between_layers
from services.learner.observe.probe import ProbeMeter
from services.learner.feed.prompts import RunPrompts, load_run_prompts
from services.learner.publish import PublishThread, WeightPublisher
from services.learner.observe.runstate import RunState
from services.learner.intake.seen_groups import SeenGroups
from services.learner.observe.step_metrics import RunCounters, step_metrics
from services.learner.observe.thread_clock import ThreadClock

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
        prompts: RunPrompts | None = None,
        borrow_cores: list[int] | None = None,
    ):
        self.run_id, self.cfg, self.state, self.channels = run_id, cfg, state, channels
        self.registry, self.store, self.build_policy = registry, store, build_policy
        self.keep_versions, self.resume = keep_versions, resume
        # the workers' cores for the update while they have nothing to sample (cores.py)
        self.cores = CoreBorrowing(borrow_cores or [], lambda: channels.prompt_backlog() > 0)
        self.publisher = WeightPublisher(
            store, cfg.weights.serving_dtype, cfg.weights.keyframe_every
        )
        # the publish thread may run on the workers' cores too (cores.py: roam)
        self.sender = PublishThread(
            self._send, cfg.asynchrony.publish_in_background, on_thread_start=self.cores.roam
        )
        self.publish_wait_s = 0.0  # this step's wait for the previous version to go out
        self.data = prompts or load_run_prompts(cfg)
        epoch = uuid.uuid4().hex[:8]
        jobs = channels.prompt_queue()
        self.feed = JobFeed(run_id, cfg, self.data.train, jobs, epoch=epoch, env=self.data.env)
        self.heldout = HeldoutEval(
            run_id,
            cfg,
            self.data.heldout,
            jobs,
            epoch,
            emit=lambda step, values: state.emit(values, event="eval", step=step),
            timeout_s=cfg.asynchrony.group_timeout_s,
            env=self.data.env,
        )
        self.ckpt_dir = state.run_dir / "checkpoints"
        self.counters = RunCounters()
        self.step = 0
        self.version = 0
        self.skipped_streak = 0  # updates skipped in a row for non-finite numbers
        self.held: deque = deque()  # (version, step, bits) not yet sent (async.publish_lag)
        self.guard = RunGuard(self)  # monitors and their actions (docs/monitors.md)

    def run(self) -> None:
        try:
            self._run()
        except BaseException:
            self.sender.abandon()  # the version in flight goes out (or fails) before the run ends
            raise
        finally:
            self.cores.release()

    def _run(self) -> None:
        self.start()
        train, stop = self.cfg.train, self.state.stop_requested
        self._redis(self._top_up, "feeding")
        self._warm_forward()  # while the workers sample the first jobs
        while self.step < train.steps and not stop.is_set():
            t0 = time.perf_counter()
            self._redis(self._top_up, "feeding")
            intake = self.intake.collect(train.groups_per_step, self.version, stop)
            if intake is None:
                break  # stop requested while waiting
            t1 = time.perf_counter()
            for item in intake.consumed:
                self.feed.pass_rates.record(item.group)
            update = self._update(intake.groups)
            self._redis(lambda: self.intake.ack(intake.entries), "acking")
            self.counters.add(intake, self.feed.stratum_of, self.feed.pass_rates.success_reward)
            if self._skipped(update):
                continue
            self.step += 1
            t2 = time.perf_counter()
            self.publish_wait_s = 0.0
            if self.step % self.cfg.asynchrony.publish_every == 0:
                self.publish()
            if self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
                self.checkpoint()
            self._serve_checkpoint_request()
            self._evaluate()
            metrics = step_metrics(intake, update, self.counters)
            if self.probe is not None and self.step % self.cfg.probe.every == 0:
                metrics.update(self._measure_probes())
            t3 = time.perf_counter()
            metrics.update(
                {
                    "learner/step_s": t3 - t0,
                    "learner/wait_s": t1 - t0,
                    "learner/update_s": t2 - t1,
                    "learner/publish_s": t3 - t2,
                    "learner/publish_wait_s": self.publish_wait_s,
                    "learner/publish_thread_s": self.sender.sent_s,
                    "learner/borrowed_s": self.cores.take_seconds(),
                    "learner/weight_version": self.version,
                }
            )
            self.state.step, self.state.weight_version = self.step, self.version
            self.guard.check(metrics)  # alarms: warn, stop or roll back (guard/actions.py)
            self.state.emit(
                metrics,
                extra={
                    "groups": [g.group_id for g in intake.groups],
                    "group_paths": [len(g.paths) for g in intake.groups],
                },
            )
            self.state.samples(intake.groups, self.cfg.samples_every)
        self.finish()

    def _update(self, groups) -> dict[str, float]:
        """The policy's update of ``groups``, cut to train.keep_paths paths each
        (algo/downsample.py), on the workers' cores too while they have nothing to sample (checked
        between chunks and between the model's layers: cores.py, model/layer_hooks.py), and this
        thread's seconds in it on a core and waiting for one (observe/thread_clock.py; Linux)."""
        clock = ThreadClock()
        clock.start()
        with between_layers(self.policy.model if self.cores.enabled else None, self.cores.refresh):
            update = self.policy.update(keep_paths(groups, self.cfg.train, self.step))
        self.cores.release()  # the jobs the next collect sends go to the workers' cores
        if (on_core := clock.stop()) is not None:
            update["learner/update_running_s"] = on_core.running_s
            update["learner/update_runnable_s"] = on_core.runnable_s
        return update

    def _top_up(self, needed: int | None = None) -> None:
        """Send jobs while there is room (JobFeed.top_up); ``needed``: the groups the update
        being collected still needs (None between updates: a step's)."""
        if needed is None:
            needed = self.cfg.train.groups_per_step
        self.feed.top_up(self.intake.consumed, LearnerAt(self.step, self.version, needed))

    def _skipped(self, update: dict[str, float]) -> bool:
        """True for an update the policy skipped (non-finite loss or gradient)."""
        if not update.get("learner/skipped_step"):
            self.skipped_streak = 0
            return False
        self.skipped_streak += 1
        self.counters.counts["learner/skipped_steps"] += 1
        self.state.emit({**update, **self.counters.counts}, event="skipped_step")
        if self.skipped_streak >= self.cfg.train.max_skipped_steps:
            raise FloatingPointError(
                f"{self.skipped_streak} updates in a row had a non-finite loss or gradient "
                f"(last: {sorted(k for k in update if 'nonfinite' in k)}); lower the learning "
                "rate or check the rewards"
            )
        return True

    def _evaluate(self) -> None:
        """Start the held-out round due at this step; close rounds that waited too long."""
        if self.heldout.due(self.step):
            # the round is sampled by the version just made: wait until the workers can see it
            self.publish_wait_s += self.sender.join()
            self._redis(lambda: self.heldout.start(self.step), "sending evaluation jobs")
        self.heldout.poll()

    def _warm_forward(self) -> None:
        """The policy's first forward, of a micro-batch as long as the run's longest first
        prompts plus max_tokens, paid during the pipeline's fill (Policy.warm_forward)."""
        longest = max((len(p.token_ids) for p in self.data.train[:64]), default=0)
        length = longest + (self.cfg.sampling.max_tokens or DEFAULT_MAX_TOKENS)
        seconds = self.policy.warm_forward(self.cfg.train.micro_batch_paths, length)
        log.info(
            "first forward (%d x %d tokens) in %.2fs",
            self.cfg.train.micro_batch_paths,
            length,
            seconds,
        )

    def _redis(self, fn, what: str):
        return retry_while_down(fn, self.cfg.asynchrony.redis_outage_s, what)

    # -- start and end ------------------------------------------------------------------------
    def _measure_probes(self) -> dict[str, float]:
        t0 = time.perf_counter()
        out = self.probe.measure(self.policy.model)
        return {**out, "probe/seconds": time.perf_counter() - t0}

    def start(self) -> None:
        self.policy = self.build_policy()
        self.policy.before_chunk = self.cores.refresh
        self.probe = None
        if self.cfg.probe is not None:
            self.probe = ProbeMeter.for_run(self.cfg.probe.path, self.cfg.model, self.policy.pad_id)
        asynchrony = self.cfg.asynchrony
        dead = DeadLetterWatch(self.channels, self.feed.queue, asynchrony.dead_letter_retries)
        self.intake = GroupIntake(
            self.channels.path_queue(claim_idle_ms=NEVER_RECLAIM_MS),
            asynchrony,
            on_consumed=lambda: self._top_up(self.intake.needed),
            lost_parts=dead.poll,
            on_eval=self.heldout.take,
        )
        if self.resume:
            self._restore()
        else:
            # A run id used before keeps that run's streams for run_keys_ttl_s after it ended:
            # a worker would sample its leftover jobs (holding them for weight versions this run
            # has not made) and this run would take its groups for its own (g<cursor> ids).
            self._redis(self.channels.clear_prompts, "clearing an earlier run's jobs")
            self._redis(self.channels.clear_paths, "clearing an earlier run's groups")
            # Version 0 is the initial policy, published so that workers which served another
            # run before load it rather than keep that run's weights.
            self.version = -1
            self.publish(at_once=True)
        if self.probe is not None:  # the baseline: the policy before this process's updates
            self._measure_probes()
        self.guard.start()
        self._redis(lambda: self.registry.announce(self.run_id), "announcing the run")
        data = {
            "data/train_prompts": len(self.data.train),
            "data/heldout_prompts": len(self.data.heldout),
            "data/prompts_too_long": self.data.too_long,
        }
        self.state.emit({"learner/weight_version": self.version, **data}, event="start")
        if not self.resume:
            self._evaluate()

    def finish(self) -> None:
        while self.held:  # versions held back by async.publish_lag: every version reaches disk
            self.sender.submit(*self.held.popleft())
        self.sender.close()
        stop = self.state.stop_requested
        if self.heldout.busy and not stop.is_set():  # the last round, sampled by the last version
            timeout = self.cfg.asynchrony.group_timeout_s
            self.intake.drain_eval(lambda: not self.heldout.busy, timeout, stop)
            self.heldout.poll()
        self.checkpoint()
        self.policy.export(self.state.run_dir / "final")
        self._redis(lambda: self.registry.retire(self.run_id), "retiring the run")
        # the run's streams and sets go with it (metrics and weights stay on disk)
        ttl = self.cfg.asynchrony.run_keys_ttl_s
        self._redis(lambda: self.channels.expire(ttl), "expiring the run's keys")

    # -- weights and checkpoints ----------------------------------------------------------------
    def publish(self, at_once: bool = False) -> None:
        """A new weight version of the policy, sent by the publish thread while the learner
        goes on (``async.publish_in_background``). With ``async.publish_lag`` L the workers get
        it L versions later (its bits are held until then), so paths are sampled by weights at
        least L versions old; ``at_once`` (the first version, a restored one, a rollback)
        publishes now, waits until the workers are pointed at it, and drops the held ones."""
        self.version += 1
        # the previous send has had a whole step: waiting for it here (usually no wait) keeps
        # memory at two snapshots, the publisher's last bits and this one
        self.publish_wait_s += self.sender.join()
        bits = self.publisher.snapshot(self.policy.weights())
        lag = 0 if at_once else self.cfg.asynchrony.publish_lag
        if lag == 0:
            self.held.clear()
            self.sender.submit(self.version, self.step, bits)  # nothing in flight: joined above
            if at_once:
                self.sender.join()
            return
        self.held.append((self.version, self.step, bits))
        if len(self.held) > lag:
            self.sender.submit(*self.held.popleft())

    def _send(self, version: int, step: int, bits: dict) -> None:
        """On the publish thread: write the version, point the workers at it, prune."""
        self.publisher.publish_bits(bits, self._point_workers, version, step)
        self.store.prune(self.keep_versions)

    def _point_workers(self, pointer) -> None:
        self._redis(lambda: self.channels.publish_weights(pointer), "publishing weights")

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
                "seen": self.intake.seen.state(),
                "counters": dict(self.counters.counts),
                "budget": self.feed.budget_state(),
                "rng": rng_state(),
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
        self.intake.seen = SeenGroups.from_state(client["seen"])
        self.counters = RunCounters(client.get("counters", {}))
        self.feed.restore_budget(client.get("budget", {}))
        set_rng_state(client["rng"])
        # Groups in flight at the checkpoint may have been consumed (and acked) since: send them
        # again under this process's job ids; jobs queued by the crashed process go.
        in_flight = self.intake.seen.missing(self.feed.cursor)
        self._redis(self.channels.clear_prompts, "clearing old jobs")
        for cursor in in_flight:
            self._redis(lambda c=cursor: self.feed.send(c, self.step), "re-sending jobs")
        # Rollout workers may hold any version, even one published after the checkpoint: the
        # restored weights get a number above every version published so far.
        pointer = self._redis(self.channels.read_weights, "reading the weight pointer")
        self.version = max(self.version, pointer.version if pointer else 0)
        self.publish(at_once=True)
        log.info(
            "resumed at step %d (cursor %d, %d groups re-sent, now weight version %d)",
            self.step,
            self.feed.cursor,
            len(in_flight),
            self.version,
        )


def rng_state() -> dict:
    """Python, NumPy and torch RNG states, as JSON-able lists (part of every checkpoint)."""
    version, internal, gauss = random.getstate()
    return {
        "python": [version, list(internal), gauss],
        "numpy": [x.tolist() if hasattr(x, "tolist") else x for x in np.random.get_state()],
        "torch": torch.get_rng_state().tolist(),
    }


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
