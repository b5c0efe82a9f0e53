"""An engine call's tail in a process of its own (``tail_process``, the rollout config).

The tail (selection, the paths' protobufs, ScoreBatch, the Redis publish; finish.py) is Python:
on the tail thread it holds the worker's GIL while the engine's own Python (vLLM's scheduler,
the model's op dispatch) waits for it, and a thread cannot take that work to another core. Here
a child process (spawned, so none of vLLM's threads or locks are inherited) runs a
``CallFinisher`` of its own (its own Redis connection and reward channel, publishing as the
worker's consumer name), on ``background_cores`` where the launcher gives them (what the move
buys on 2 cores is that core's idle time more than the GIL: docs/performance.md); the worker hands
it each call's jobs (the claims by run and entry, the jobs, the engine's samples) over a pipe
and waits for the answer on the tail thread, so the loop's contract is unchanged: one tail at a
time, its error raised at the next hand-off, the lease kept by the worker until the answer.

A child that died is started again at the next call; the call it was running failed, so its jobs
stay pending and are reclaimed (the publish-once script keeps any group single). The child is
stopped by its pid. With ``tail_nice`` it runs in a session of its own at that priority
(brorl/priority.py), so a signal to the worker's process group misses it: it ends when its pipe
reaches end of file, the worker gone.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import traceback
from dataclasses import dataclass

from brorl import priority

log = logging.getLogger(__name__)

STOP_WAIT_S = 10.0  # a tail still running at close is given this long


class TailFailed(RuntimeError):
    """The tail process failed a call (its traceback in the message) or died under it."""


@dataclass(frozen=True)
class TailSpec:
    """What the child builds its finisher from."""

    config: object  # RolloutServiceConfig: Redis, the reward service, its deadline, the model
    name: str  # the worker's consumer name: the groups' publisher
    cores: tuple[int, ...] = ()  # the child's CPU affinity; () inherits the worker's
    nice: int = 0  # > 0: the child in a session of its own at this nice value (brorl/priority.py)
    log_level: int = logging.INFO


class TailProcess:
    """The worker's side: ``finish`` has CallFinisher's signature and runs it in the child."""

    def __init__(self, spec: TailSpec, stats):
        self.spec, self.stats = spec, stats
        self.publish_s = 0.0
        self._ctx = multiprocessing.get_context("spawn")
        self._proc = None
        self._conn = None
        self._start()

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(
            target=_child_main, args=(child, self.spec), name="rollout-tail", daemon=True
        )
        self._proc.start()
        child.close()
        self._conn = parent
        log.info("tail process %d started", self._proc.pid)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def finish(self, sampled: list, between: dict[str, float], version: int) -> None:
        """Send the call to the child and wait for it to be published; raises TailFailed."""
        if not self._proc.is_alive():
            log.warning(
                "tail process %d exited (code %s): starting another",
                self._proc.pid,
                self._proc.exitcode,
            )
            self._start()
        calls = [(claim.channels.run_id, claim.delivery, job, gen) for (claim, job), gen in sampled]
        try:
            self._conn.send((calls, between, version))
            answer = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise TailFailed(f"the tail process {self._proc.pid} died under a call: {exc}") from exc
        for (claim, _job), _gen in sampled:  # acked by the child (or failed: reclaimable)
            claim.release()
        if answer[0] == "error":
            raise TailFailed(f"the tail process failed a call:\n{answer[1]}")
        _, published, self.publish_s = answer
        self.stats.groups_published += published

    def close(self) -> None:
        """Stop the child by its pid once its current call is done."""
        if self._proc is None:
            return
        try:
            self._conn.send(None)
        except OSError:
            pass
        self._proc.join(STOP_WAIT_S)
        if self._proc.is_alive():
            log.warning(
                "tail process %d still running after %.0f s: killed", self._proc.pid, STOP_WAIT_S
            )
            self._proc.kill()
            self._proc.join()
        self._conn.close()


def _child_main(conn, spec: TailSpec) -> None:
    """The child: one call at a time until told to stop (None) or the worker is gone."""
    from brorl.service_main import setup_logging

    setup_logging(logging.getLevelName(spec.log_level))  # the worker's format and level
    if spec.cores:
        os.sched_setaffinity(0, spec.cores)
    if spec.nice:  # before _build starts any thread: they inherit it
        priority.own_session_below(spec.nice)
    finisher, claims_of = _build(spec)
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the worker died: nothing left to publish for
            return
        if message is None:
            return
        calls, between, version = message
        before = finisher.stats.groups_published
        try:
            sampled = [
                ((claims_of(run_id, delivery), job), gen) for run_id, delivery, job, gen in calls
            ]
            finisher.finish(sampled, between, version)
            conn.send(("ok", finisher.stats.groups_published - before, finisher.publish_s))
        except Exception:  # noqa: BLE001 - the worker raises it at its next hand-off
            conn.send(("error", traceback.format_exc()))


def _build(spec: TailSpec):
    """The child's finisher and a maker of its claims (its own channels per run)."""
    from brorl import queue as q
    from brorl import rpc
    from brorl.v1 import reward_pb2_grpc
    from services.rollout.tail.finish import CallFinisher, Claimed, RunConsumers
    from services.rollout.scoring import RewardCalls

    config = spec.config
    redis_client = q.connect(config.redis_url)
    stub = reward_pb2_grpc.RewardServiceStub(rpc.channel(config.reward_address, config.security))
    tokenizer = []

    def decode(token_ids: list[int]) -> str:  # explore's prefix scoring only: loaded on first use
        if not tokenizer:
            from transformers import AutoTokenizer

            tokenizer.append(AutoTokenizer.from_pretrained(config.model))
        return tokenizer[0].decode(token_ids, skip_special_tokens=True)

    finisher = CallFinisher(RewardCalls(stub, config.reward_deadline_s), spec.name, decode)
    consumers = RunConsumers(
        lambda run_id: q.RunChannels(redis_client, run_id, namespace=config.namespace),
        spec.name,
        config.claim_idle_ms,
    )

    def claims_of(run_id: str, delivery) -> Claimed:
        return Claimed(*consumers(run_id), delivery)

    return finisher, claims_of
