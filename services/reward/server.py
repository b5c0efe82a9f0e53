"""RewardService servicer: protobuf → registry call → protobuf."""

from __future__ import annotations

import logging
import math
import time

from brorl import rpc
from brorl.errors import InvalidArgument, ResourceExhausted
from brorl.metrics import Metrics
from brorl.v1 import reward_pb2, reward_pb2_grpc
from services.reward.base import Score, ScoreItem
from services.reward.config import RewardServiceConfig
from services.reward.registry import Registry, build_registry

log = logging.getLogger(__name__)
SERVICE_NAME = reward_pb2.DESCRIPTOR.services_by_name["RewardService"].full_name


def _result(item_id: str, s: Score) -> reward_pb2.ScoreResult:
    return reward_pb2.ScoreResult(
        id=item_id,
        reward=s.reward,
        components=s.components,
        status=s.status,
        detail=s.detail,
        latency_ms=s.latency_ms,
    )


def _item(req: reward_pb2.ScoreRequest) -> ScoreItem:
    return ScoreItem(
        id=req.id,
        prompt=req.prompt,
        completion=req.completion,
        reference=req.reference,
        extra=dict(req.extra),
    )


# Upper bounds of the reward histogram: rewards are clipped to [-clip, clip] (3 by default) and
# most functions score in [0, 1].
REWARD_BUCKETS = (-3.0, -1.0, -0.5, -0.1, 0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 2.0, 3.0)


class ScoreMetrics:
    """What the reward service scored: paths by function and status, and their rewards."""

    def __init__(self, metrics: Metrics):
        self.scored = metrics.counter(
            "reward_scored_total", "Paths scored, by reward function and status", ("fn", "status")
        )
        self.value = metrics.histogram(
            "reward_value", "Rewards given, by reward function", ("fn",), buckets=REWARD_BUCKETS
        )
        self.score = metrics.summary(
            "reward_score", "Sum and count of the rewards given (their mean), by function", ("fn",)
        )

    def observe(self, fn: str, scores: list[Score]) -> None:
        for s in scores:
            self.scored.labels(fn, s.status).inc()
            if math.isfinite(s.reward):
                self.value.labels(fn).observe(s.reward)
                self.score.labels(fn).observe(s.reward)


class RewardServicer(reward_pb2_grpc.RewardServiceServicer):
    def __init__(self, registry: Registry, max_batch: int, metrics: Metrics | None = None):
        self.registry = registry
        self.max_batch = max_batch
        self.score_metrics = ScoreMetrics(metrics or Metrics())

    @rpc.translate_errors
    def Score(self, request, context):
        if not request.reward_fn:
            raise InvalidArgument("reward_fn", "is empty; name a function from ListRewardFunctions")
        [score] = self.registry.score(request.reward_fn, [_item(request)])
        self.score_metrics.observe(request.reward_fn, [score])
        return _result(request.id, score)

    @rpc.translate_errors
    def ScoreBatch(self, request, context):
        if not request.reward_fn:
            raise InvalidArgument("reward_fn", "is empty; name a function from ListRewardFunctions")
        if len(request.items) > self.max_batch:
            raise ResourceExhausted(
                f"items: batch of {len(request.items)} exceeds max_batch={self.max_batch}; "
                f"split it into batches of at most {self.max_batch}"
            )
        self.registry.get(
            request.reward_fn
        )  # unknown name → INVALID_ARGUMENT even for an empty batch
        start = time.perf_counter()
        scores = self.registry.score(request.reward_fn, [_item(i) for i in request.items])
        self.score_metrics.observe(request.reward_fn, scores)
        return reward_pb2.ScoreBatchResponse(
            results=[_result(i.id, s) for i, s in zip(request.items, scores)],
            latency_ms=(time.perf_counter() - start) * 1000,
        )

    @rpc.translate_errors
    def ListRewardFunctions(self, request, context):
        return reward_pb2.ListRewardFunctionsResponse(
            functions=[
                reward_pb2.RewardFunctionInfo(name=n, description=d)
                for n, d in self.registry.describe()
            ]
        )


class RewardServer(rpc.Server):
    """An rpc.Server that also closes its registry (the code sandbox, judge pools) when stopped."""

    registry: Registry

    def stop(self, grace: float = 2.0) -> None:
        try:
            super().stop(grace)
        finally:
            self.registry.close()


def build_server(config: RewardServiceConfig, registry: Registry | None = None) -> RewardServer:
    registry = registry if registry is not None else build_registry(config)
    metrics = Metrics()
    server = RewardServer(
        config.bind,
        [SERVICE_NAME],
        max_workers=config.workers,
        security=config.security,
        max_concurrent_rpcs=config.max_concurrent_rpcs,
        metrics=metrics,
    )
    server.registry = registry
    servicer = RewardServicer(registry, config.max_batch, metrics)
    reward_pb2_grpc.add_RewardServiceServicer_to_server(servicer, server.grpc)
    return server


def serve(config: RewardServiceConfig) -> None:
    server = build_server(config)
    log.info("reward functions: %s", ", ".join(server.registry.names()))
    # the registry loads its reward models before health says SERVING; RewardServer.stop closes it
    rpc.serve_until_stopped(
        server,
        "reward",
        config.port_file,
        prepare=server.registry.warm,
        metrics_bind=config.metrics_bind,
    )
