"""LearnerService servicer and the composition root of the learner process.

One run trains at a time, on a background thread of this process (the DeepSpeed engine lives
here); the RPCs start, observe, checkpoint and stop it.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
import uuid
from pathlib import Path

import torch

from brorl import queue as q
from brorl import rpc
from brorl.config import dump
from brorl.errors import FailedPrecondition, InvalidArgument, NotFound
from brorl.runconfig import parse_run_config
from brorl.v1 import learner_pb2, learner_pb2_grpc
from brorl.weights import WeightStore
from services.learner.config import LearnerServiceConfig
from services.learner.prompts import load_prompts
from services.learner.read_roots import ReadRoots
from services.learner.runstate import RunState
from services.learner.train import Trainer

log = logging.getLogger(__name__)
SERVICE_NAME = learner_pb2.DESCRIPTOR.services_by_name["LearnerService"].full_name
_RUN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class LearnerServicer(learner_pb2_grpc.LearnerServiceServicer):
    def __init__(self, config: LearnerServiceConfig, redis_client):
        self.config = config
        self.r = redis_client
        self.runs: dict[str, RunState] = {}
        self.threads: dict[str, threading.Thread] = {}
        self.lock = threading.Lock()
        self.registry = q.RunRegistry(redis_client, config.namespace)
        # runs_dir is always readable: a run may start from an earlier run's final weights.
        self.read_roots = ReadRoots([*config.read_roots, config.runs_dir])
        log.info("run configs may read under %s", ", ".join(map(str, self.read_roots.roots)))

    def _build_policy(self, cfg):
        from services.learner.policy import Policy  # heavy: transformers, DeepSpeed

        return Policy(cfg.model, cfg.train, self.config.zero_stage)

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
        cfg = parse_run_config(request.config_yaml)
        self.read_roots.confine(cfg)  # before anything looks at the files
        if not Path(cfg.model).is_dir():
            raise InvalidArgument("model", f"directory {cfg.model} does not exist")
        load_prompts(cfg.data.train_path)  # bad data is the caller's error: report it now
        run_id = request.run_id or time.strftime("run-%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        if not _RUN_ID.match(run_id):
            raise InvalidArgument("run_id", "use 1-64 letters, digits, '.', '_' or '-'")
        with self.lock:
            busy = [r for r in self.runs.values() if not r.ended]
            if busy:
                raise FailedPrecondition(f"run {busy[0].run_id} is still running; StopRun it first")
            run_dir = Path(self.config.runs_dir) / run_id
            if run_dir.exists() and not request.resume and (run_dir / "metrics.jsonl").exists():
                raise FailedPrecondition(
                    f"run {run_id} already exists in {run_dir}; "
                    "set resume=true or pick a new run_id"
                )
            if request.resume and not (run_dir / "checkpoints").is_dir():
                raise FailedPrecondition(f"run {run_id} has no checkpoint to resume in {run_dir}")
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text(dump(cfg))
            state = RunState(run_id, run_dir, cfg.train.steps)
            store = WeightStore(self.config.weights_dir or run_dir / "weights")
            trainer = Trainer(
                run_id,
                cfg,
                state,
                q.RunChannels(self.r, run_id),
                self.registry,
                store,
                functools.partial(self._build_policy, cfg),
                keep_versions=self.config.keep_weight_versions,
                resume=request.resume,
            )
            thread = threading.Thread(
                target=self._train, args=(trainer, state), name=f"train-{run_id}", daemon=True
            )
            self.runs[run_id], self.threads[run_id] = state, thread
            thread.start()
        log.info("started run %s in %s", run_id, run_dir)
        return self._info(state)

    def _train(self, trainer: Trainer, state: RunState) -> None:
        try:
            trainer.run()
            stopped = state.stop_requested.is_set()
            state.finish("stopped" if stopped else "finished", trainer.guard.stop_message)
        except Exception as exc:  # noqa: BLE001 - the run fails, the service keeps serving
            log.exception("run %s failed", state.run_id)
            state.finish("failed", f"{type(exc).__name__}: {exc}")

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
            thread.join(timeout=120)
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
            if not state.checkpoint_done.wait(timeout=600):
                raise FailedPrecondition(
                    "checkpoint did not complete within 600 s (is the run waiting for paths?)"
                )
        path, step = state.last_checkpoint
        return learner_pb2.CheckpointResponse(path=path, step=step)


def serve(config: LearnerServiceConfig) -> None:
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    redis_client = q.connect(config.redis_url)
    redis_client.ping()
    # One handler thread per admitted RPC: long-lived WatchRun streams must not leave an admitted
    # StopRun waiting for a thread.
    server = rpc.Server(
        config.bind,
        [SERVICE_NAME],
        max_workers=config.max_concurrent_rpcs,
        security=config.security,
        max_concurrent_rpcs=config.max_concurrent_rpcs,
    )
    learner_pb2_grpc.add_LearnerServiceServicer_to_server(
        LearnerServicer(config, redis_client), server.grpc
    )
    rpc.serve_until_stopped(server, "learner", config.port_file)
