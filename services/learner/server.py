"""LearnerService servicer and the composition root of the learner process.

One run trains at a time, on a background thread of this process (the DeepSpeed engine lives
here); the RPCs start, observe, checkpoint and stop it.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path

import grpc
import torch

from brorl import queue as q
from brorl import rpc
from brorl.config.base import dump
from brorl.contract import KeyName, LearnerWaits
from brorl.errors import FailedPrecondition, InvalidArgument, NotFound
from brorl.metrics import Metrics
from brorl.config.run import parse_run_config
from brorl.v1 import learner_pb2, learner_pb2_grpc
from brorl.weights.store import WeightStore
from services.learner.config import LearnerServiceConfig
from services.learner.observe.live_metrics import StepGauges, queue_samples
from services.learner.feed.prompts import load_prompts, load_run_prompts
from services.learner.model import deepspeed_engine
from services.learner.read_roots import ReadRoots
from services.learner.observe.runstate import RunState
from services.learner.observe.sinks import build_sinks, check_trackers
from services.learner.train import Trainer

log = logging.getLogger(__name__)
SERVICE_NAME = learner_pb2.DESCRIPTOR.services_by_name["LearnerService"].full_name


class LearnerServicer(learner_pb2_grpc.LearnerServiceServicer):
    def __init__(
        self,
        config: LearnerServiceConfig,
        redis_client,
        metrics: Metrics | None = None,
        ranks=None,
    ):
        self.config = config
        self.ranks = ranks  # services.learner.ranks.RankGroup with several ranks
        self.r = redis_client
        metrics = metrics or Metrics()
        self.step_gauges = StepGauges(metrics)
        self.channels: q.RunChannels | None = None  # of the latest run (its streams' depths)
        metrics.read_at_scrape(lambda: queue_samples(lambda: self.channels))
        self.runs: dict[str, RunState] = {}
        self.threads: dict[str, threading.Thread] = {}
        self.lock = threading.Lock()
        self.registry = q.RunRegistry(redis_client, config.namespace)
        holder = f"{socket.gethostname()} pid {os.getpid()} #{uuid.uuid4().hex[:6]}"
        self.lease = q.NamespaceLease(
            redis_client, config.namespace, holder, config.namespace_lease_s
        )
        # runs_dir is always readable: a run may start from an earlier run's final weights.
        self.read_roots = ReadRoots([*config.read_roots, config.runs_dir])
        log.info("run configs may read under %s", ", ".join(map(str, self.read_roots.roots)))

    def _build_policy(self, cfg):
        make = make_policy(self.config.zero_stage)
        if self.ranks is None:
            return make(cfg)
        from services.learner.ranks import DistributedPolicy

        return DistributedPolicy(self.ranks, cfg, make)

    def _info(self, st: RunState) -> learner_pb2.RunInfo:
        return learner_pb2.RunInfo(
            run_id=st.run_id,
            state=st.state,
            step=st.step,
            total_steps=st.total_steps,
            weight_version=st.weight_version,
            run_dir=str(st.run_dir),
            message=st.message,
            last_metrics=st.last,
        )

    def _run(self, run_id: str) -> RunState:
        if run_id not in self.runs:
            raise NotFound(f"run_id: no run {run_id!r} in this learner")
        return self.runs[run_id]

    @rpc.translate_errors
    def StartRun(self, request, context):
        cfg, prompts = self._checked_run(request)
        run_id = request.run_id or time.strftime("run-%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        if not KeyName.fits(run_id):
            raise InvalidArgument("run_id", KeyName.RULE)
        with self.lock:
            busy = [r for r in self.runs.values() if not r.ended]
            if busy:
                raise FailedPrecondition(f"run {busy[0].run_id} is still running; StopRun it first")
            self._take_namespace()
            try:
                trainer, state = self._new_run(run_id, cfg, prompts, request.resume)
            except BaseException:
                self.lease.release()
                raise
            thread = threading.Thread(
                target=self._train, args=(trainer, state), name=f"train-{run_id}", daemon=True
            )
            self.runs[run_id], self.threads[run_id] = state, thread
            thread.start()
        log.info("started run %s in %s", run_id, state.run_dir)
        return self._info(state)

    def _take_namespace(self) -> None:
        """This learner's lease on its namespace for the run (brorl.queue.NamespaceLease)."""
        other = self.lease.take()
        if other:
            raise FailedPrecondition(
                f"namespace {self.config.namespace!r} is in use by another learner ({other}), "
                "and the rollout workers follow its run: give this learner (and its workers) a "
                "namespace of its own (config `namespace`), or stop the other run first"
            )

    def _new_run(self, run_id: str, cfg, prompts, resume: bool) -> tuple[Trainer, RunState]:
        run_dir = self._run_dir(run_id, resume)
        (run_dir / "config.yaml").write_text(dump(cfg))
        sinks = build_sinks(
            cfg.logging,
            run_id,
            run_dir,
            cfg.model_dump(mode="json", by_alias=True),
            extra=[self.step_gauges],
        )
        state = RunState(run_id, run_dir, cfg.train.steps, sinks)
        store = WeightStore(self.config.weights_dir or run_dir / "weights")
        self.channels = q.RunChannels(self.r, run_id, namespace=self.config.namespace)
        trainer = Trainer(
            run_id,
            cfg,
            state,
            self.channels,
            self.registry,
            store,
            functools.partial(self._build_policy, cfg),
            keep_versions=self.config.keep_weight_versions,
            resume=resume,
            prompts=prompts,
            borrow_cores=self.config.borrow_cores,
        )
        return trainer, state

    def _checked_run(self, request):
        """The request's run config and prompts, every check a caller can act on made before
        anything starts (INVALID_ARGUMENT / PERMISSION_DENIED / FAILED_PRECONDITION)."""
        if self.ranks is not None and self.ranks.failure:
            raise FailedPrecondition(f"{self.ranks.failure}: restart the learner for a new run")
        cfg = parse_run_config(request.config_yaml)
        self.read_roots.confine(cfg)  # before anything looks at the files
        if not Path(cfg.model).is_dir():
            raise InvalidArgument("model", f"directory {cfg.model} does not exist")
        from services.learner.model.deepspeed_engine import check_optimizer

        refused = check_optimizer(cfg.train, self.config.zero_stage, torch.cuda.is_available())
        if refused:
            raise InvalidArgument("train.optimizer", refused)
        # Bad data is the caller's error: report it now (this also fills the model's defaults
        # into cfg, so config.yaml records them).
        prompts = load_run_prompts(cfg)
        check_trackers(cfg.logging)  # W&B / MLflow enabled but not installed: before any file
        if cfg.env is not None:
            check_environment(cfg.env.address, self.config.security)
        if cfg.probe is not None:
            load_prompts(cfg.probe.path, field="probe.path")
            if self.ranks is not None and self.config.zero_stage == 3:
                raise InvalidArgument(
                    "probe",
                    "is measured on rank 0 alone, which ZeRO-3's partitioned "
                    "parameters do not allow with several ranks: use zero_stage 2 or no probe",
                )
        return cfg, prompts

    def _run_dir(self, run_id: str, resume: bool) -> Path:
        """The run's directory, made; refused for a run id that exists (unless resuming) and
        for a resume without a checkpoint. Under ``self.lock``."""
        run_dir = Path(self.config.runs_dir) / run_id
        if run_dir.exists() and not resume and (run_dir / "metrics.jsonl").exists():
            raise FailedPrecondition(
                f"run {run_id} already exists in {run_dir}; set resume=true or pick a new run_id"
            )
        if resume and not (run_dir / "checkpoints").is_dir():
            raise FailedPrecondition(f"run {run_id} has no checkpoint to resume in {run_dir}")
        run_dir.mkdir(parents=True, exist_ok=True)
        return run_dir

    def _train(self, trainer: Trainer, state: RunState) -> None:
        try:
            trainer.run()
            stopped = state.stop_requested.is_set()
            outcome = ("stopped" if stopped else "finished", trainer.guard.stop_message)
        except Exception as exc:  # noqa: BLE001 - the run fails, the service keeps serving
            log.exception("run %s failed", state.run_id)
            outcome = ("failed", f"{type(exc).__name__}: {exc}")
        try:  # before the run reads as ended, when the next StartRun may take the namespace
            self.lease.release()
        finally:
            state.finish(*outcome)

    @rpc.translate_errors
    def GetRun(self, request, context):
        return self._info(self._run(request.run_id))

    @rpc.translate_errors
    def WatchRun(self, request, context):
        state = self._run(request.run_id)
        yield from state.watch(request.from_step, is_active=context.is_active)

    @rpc.translate_errors
    def StopRun(self, request, context):
        state = self._run(request.run_id)
        state.stop_requested.set()
        thread = self.threads.get(request.run_id)
        if thread:
            thread.join(timeout=LearnerWaits.STOP_S)
        return self._info(state)

    @rpc.translate_errors
    def Checkpoint(self, request, context):
        state = self._run(request.run_id)
        if state.ended:
            if state.last_checkpoint is None:
                raise FailedPrecondition(f"run {state.run_id} ended without a checkpoint")
            path, step = state.last_checkpoint
            return learner_pb2.CheckpointResponse(path=path, step=step)
        with state.checkpoint_done:
            state.checkpoint_requested.set()
            if not state.checkpoint_done.wait(timeout=LearnerWaits.CHECKPOINT_S):
                raise FailedPrecondition(
                    f"checkpoint did not complete within {LearnerWaits.CHECKPOINT_S:.0f} s "
                    "(is the run waiting for paths?)"
                )
        path, step = state.last_checkpoint
        return learner_pb2.CheckpointResponse(path=path, step=step)


def check_environment(address: str, security, timeout_s: float = 10.0) -> None:
    """An EnvironmentService answers Describe at ``address``; else INVALID_ARGUMENT naming
    env.address (the rollout workers would fail every episode of the run)."""
    from brorl.v1 import environment_pb2, environment_pb2_grpc

    with rpc.channel(address, security) as channel:
        stub = environment_pb2_grpc.EnvironmentServiceStub(channel)
        try:
            about = stub.Describe(environment_pb2.DescribeRequest(), timeout=timeout_s)
        except grpc.RpcError as exc:
            raise InvalidArgument(
                "env.address",
                f"no EnvironmentService answers at {address} ({exc.code().name}: "
                f"{(exc.details() or '')[:200]}); start it, or fix the address",
            ) from None
    log.info("environment %s v%s at %s", about.name, about.version, address)


def make_policy(zero_stage: int):
    def make(cfg):
        from services.learner.model.policy import Policy  # heavy: transformers, DeepSpeed

        return Policy(cfg.model, cfg.train, zero_stage)

    return make


def warm_up(one_rank: bool) -> float:
    """What every process pays once before its first policy, paid before the service serves
    instead of inside the first run's RL time: importing transformers' model classes (≈ 2 s
    here) and, for one rank, DeepSpeed with its process group (its shm comm op, ≈ 1.7 s).
    Several ranks import DeepSpeed and join their group when their first run starts
    (services/learner/ranks.py). Returns the seconds it took."""
    start = time.perf_counter()
    from transformers import AutoModelForCausalLM  # noqa: F401 - the import is the warm-up

    from services.learner.model import policy  # noqa: F401

    if one_rank:
        deepspeed_engine.init_distributed()
    return time.perf_counter() - start


def serve(config: LearnerServiceConfig) -> None:
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    ranks = None
    if (deepspeed_engine.launcher_world() or config.ranks) > 1:
        from services.learner import ranks as rank_group

        children = rank_group.start_ranks(config.ranks, config.collective_timeout_s)
        if int(os.environ["RANK"]) > 0:  # no gRPC, no Redis: do what rank 0 says
            rank_group.follow(make_policy(config.zero_stage))
            return
        world = int(os.environ["WORLD_SIZE"])
        ranks = rank_group.RankGroup(world, children, config.collective_timeout_s / 4)
        log.info("learner rank 0 of %d (children %s)", world, [c.pid for c in children])
    log.info("learner warmed up in %.1fs", warm_up(one_rank=ranks is None))
    redis_client = q.connect(config.redis_url)
    redis_client.ping()
    # One handler thread per admitted RPC: long-lived WatchRun streams must not leave an admitted
    # StopRun waiting for a thread.
    metrics = Metrics()
    server = rpc.Server(
        config.bind,
        [SERVICE_NAME],
        max_workers=config.max_concurrent_rpcs,
        security=config.security,
        max_concurrent_rpcs=config.max_concurrent_rpcs,
        metrics=metrics,
    )
    learner_pb2_grpc.add_LearnerServiceServicer_to_server(
        LearnerServicer(config, redis_client, metrics, ranks), server.grpc
    )
    try:
        rpc.serve_until_stopped(
            server, "learner", config.port_file, metrics_bind=config.metrics_bind
        )
    finally:
        if ranks is not None:
            ranks.close()
