"""RolloutService servicer plus the composition root of the rollout process."""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid

from brorl import queue as q
from brorl import rpc, sampling
from brorl.errors import InvalidArgument, Unavailable
from brorl.metrics import Metrics, Sample
from brorl.v1 import reward_pb2_grpc, rollout_pb2, rollout_pb2_grpc
from services.rollout.config import RolloutServiceConfig
from services.rollout.engine import EngineLock
from services.rollout.samples import to_paths, validate_sampling
from services.rollout.episodes import EnvironmentChannels
from services.rollout.tail.process import TailProcess, TailSpec
from services.rollout.worker import RolloutWorker, WorkerStats

log = logging.getLogger(__name__)
SERVICE_NAME = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name


class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(
        self, engine, engine_lock: EngineLock, config: RolloutServiceConfig, stats: WorkerStats
    ):
        self.engine = engine
        self.lock = engine_lock
        self.config = config
        self.stats = stats
        self.name = q.consumer_name()

    def _generate(self, request):
        if self.engine is None:
            raise Unavailable("the engine is still loading; retry when health reports SERVING")
        if not request.prompt.strip():
            raise InvalidArgument("prompt", "is empty; send the text to continue")
        validate_sampling(request.sampling, self.config.max_n)
        prompt_id = request.prompt_id or uuid.uuid4().hex[:12]
        start = time.perf_counter()
        with self.lock:
            version = self.engine.weight_version
            try:
                [(prompt_ids, samples)] = self.engine.generate(
                    [request.prompt], **sampling.effective(request.sampling).engine_kwargs()
                )
            except (
                ValueError
            ) as exc:  # the engine's own validation (e.g. prompt longer than max_model_len)
                raise InvalidArgument("sampling", str(exc)) from None
        paths = to_paths(
            samples,
            group_id=prompt_id,
            prompt_id=prompt_id,
            version=version,
            sampling=request.sampling,
            worker=self.name,
        )
        self.stats.paths_generated += len(paths)
        self.stats.tokens_generated += sum(len(p.token_ids) for p in paths)
        return rollout_pb2.GenerateResponse(
            paths=paths,
            weight_version=version,
            prompt_token_ids=prompt_ids,
            seconds=time.perf_counter() - start,
        )

    @rpc.translate_errors
    def Generate(self, request, context):
        return self._generate(request)

    @rpc.translate_errors
    def GenerateStream(self, request, context):
        # The engine returns a request's paths together; they are streamed one message each so a
        # client can start consuming before the whole group is deserialised.
        yield from self._generate(request).paths

    @rpc.translate_errors
    def GetStatus(self, request, context):
        ready = self.engine is not None
        return rollout_pb2.RolloutStatus(
            worker=self.name,
            model=self.config.model,
            weight_version=self.engine.weight_version if ready else 0,
            paths_generated=self.stats.paths_generated,
            tokens_generated=self.stats.tokens_generated,
            max_n=self.config.max_n,
            ready=ready,
        )


def build_engine(config: RolloutServiceConfig):
    from services.rollout.engine import RolloutEngine  # heavy: vLLM

    e = config.engine
    return RolloutEngine(
        config.model,
        dtype=e.dtype,
        max_model_len=e.max_model_len,
        seed=e.seed,
        gpu_memory_utilization=e.gpu_memory_utilization,
        kv_cache_gib=e.kv_cache_gib,
        max_num_seqs=e.max_num_seqs,
        enable_prefix_caching=e.enable_prefix_caching,
        cpu_threads_bind=e.cpu_threads_bind,
        in_process=e.in_process,
    )


def worker_samples(servicer: RolloutServicer) -> list[Sample]:
    """The worker's counters and weight version, read at every scrape of /metrics."""
    worker = {"worker": servicer.name}
    stats, engine = servicer.stats, servicer.engine
    counters = [
        ("rollout_paths_total", "Paths generated (rate(): paths/s)", stats.paths_generated),
        ("rollout_tokens_total", "Tokens generated (rate(): tokens/s)", stats.tokens_generated),
        ("rollout_groups_published_total", "Scored groups published", stats.groups_published),
        ("rollout_weight_reloads_total", "Weight versions loaded in place", stats.reloads),
    ]
    return [Sample(n, doc, v, worker, kind="counter") for n, doc, v in counters] + [
        Sample(
            "rollout_weight_version",
            "Weight version the engine holds (0: the model directory's)",
            engine.weight_version if engine is not None else 0,
            worker,
        ),
        Sample("rollout_engine_ready", "1 once the engine is loaded", engine is not None, worker),
    ]


ENGINE_CLOSE_WAIT_S = 5.0  # at shutdown: how long the engine's current call may finish (the
# launcher gives a service 10 s after SIGTERM)


def close_engine(engine, lock: EngineLock, wait_s: float = ENGINE_CLOSE_WAIT_S) -> None:
    """Close the engine under its lock and never give the lock back. Every engine call
    (sampling, a weight apply) holds the lock, so the worker thread cannot call a closed engine
    afterwards; a call still running after ``wait_s`` (a long wide group) is cut by the close."""
    if not lock.acquire(timeout=wait_s):
        log.warning("engine still busy after %.0f s; closing it anyway", wait_s)
    engine.close()


def tail_process(config: RolloutServiceConfig, stats: WorkerStats) -> TailProcess | None:
    """The worker's tail process, or None (its tail runs in the worker's process)."""
    if not config.tail_process:
        return None
    cores = tuple(config.background_cores)
    spec = TailSpec(
        config, q.consumer_name(), cores, log_level=logging.root.level, nice=config.tail_nice
    )
    return TailProcess(spec, stats)


def serve(config: RolloutServiceConfig, engine=None) -> None:
    metrics = Metrics()
    server = rpc.Server(
        config.bind,
        [SERVICE_NAME],
        security=config.security,
        max_concurrent_rpcs=config.max_concurrent_rpcs,
        metrics=metrics,
    )
    stats = WorkerStats()
    lock = EngineLock()
    servicer = RolloutServicer(None, lock, config, stats)
    metrics.read_at_scrape(lambda: worker_samples(servicer))
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(servicer, server.grpc)
    stop = threading.Event()

    def prepare() -> None:  # health answers NOT_SERVING while the engine loads
        servicer.engine = engine or build_engine(config)
        if config.worker_loop:
            redis_client = q.connect(config.redis_url)
            reward = reward_pb2_grpc.RewardServiceStub(
                rpc.channel(config.reward_address, config.security)
            )
            worker = RolloutWorker(
                servicer.engine,
                lock,
                q.RunRegistry(redis_client, config.namespace),
                functools.partial(q.RunChannels, redis_client, namespace=config.namespace),
                reward,
                run_id=config.run_id,
                claim_idle_ms=config.claim_idle_ms,
                batch_paths=config.batch_paths,
                overlap_tail=config.overlap_tail,
                reward_deadline_s=config.reward_deadline_s,
                weight_fetch_deadline_s=config.weight_fetch_deadline_s,
                version_wait_s=config.version_wait_s,
                watch_weights=config.watch_weights,
                background_cores=config.background_cores,
                stats=stats,
                environments=EnvironmentChannels(config.security),
                finisher=tail_process(config, stats),
            )
            threading.Thread(
                target=worker.run, args=(stop,), name="rollout-worker", daemon=True
            ).start()
        log.info("model %s loaded", config.model)

    def cleanup() -> None:
        stop.set()
        if servicer.engine is not None:
            close_engine(servicer.engine, lock)

    rpc.serve_until_stopped(
        server, "rollout", config.port_file, prepare, cleanup, metrics_bind=config.metrics_bind
    )
