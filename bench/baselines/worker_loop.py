"""The rollout workers' own loop with no learner beside them: bench/e2e.py's baseline for what
the pipeline keeps of the rollout.

bench/e2e.py's first baseline (``rollout_alone``) calls Generate and ScoreBatch over gRPC: the
engine and the reward service, one prompt a call. The worker loop does more for each group
(several prompts a call, selection, building and publishing the group through Redis) and that
work is the rollout's own, learner or not. So this window runs the loop itself: jobs built by the
learner's JobFeed from the run's own prompts and sampling settings, published as a run the
workers follow (RunRegistry), up to the run's ``max_inflight_groups`` in flight, and every group
taken from the stream as it arrives, as a learner that never trains would. No weights are
published for it: the workers keep the weights they hold and never reload.

The rate is the slope of the paths published against time (a least-squares line through
every read's arrival time and the paths taken so far, from the first group after ``warm_s`` to
the first one at least ``seconds`` later): a worker publishes a call's groups together, and a
call may be split over two reads, so a rate between two single arrivals could be one call's
paths over a few milliseconds.
"""

from __future__ import annotations

import statistics
import time

from brorl import queue as q
from brorl import sampling
from brorl.v1 import common_pb2


def worker_loop_alone(redis_url: str, namespace: str, run_cfg, seconds: float, warm_s=2.0):
    """Paths/s the workers of ``namespace`` publish for jobs like ``run_cfg``'s (a RunConfig
    with its model and data resolved) when nothing but this function consumes their groups,
    and the mean seconds a group of them spent in the engine (PathGroup.generate_seconds)."""
    from services.learner.feed.jobfeed import JobFeed
    from services.learner.feed.lookahead import LearnerAt
    from services.learner.feed.prompts import load_run_prompts

    client = q.connect(redis_url)
    run_id = f"worker-alone-{time.strftime('%H%M%S')}"
    channels = q.RunChannels(client, run_id, namespace=namespace)
    prompts = load_run_prompts(run_cfg)
    feed = JobFeed(run_id, run_cfg, prompts.train, channels.prompt_queue(), "alone", prompts.env)
    groups = channels.path_queue(consumer="bench")
    parts = len(sampling.job_parts(run_cfg.sampling, run_cfg.explore, 0))  # messages a group
    registry = q.RunRegistry(client, namespace)
    # no learner: every group in flight counts as the update under way's, so the feed holds none
    # back and none asks for a weight version (feed/lookahead.py): the bound alone, as before
    at = LearnerAt(step=0, version=0, needed=run_cfg.asynchrony.max_inflight_groups)
    feed.top_up(0, at)
    registry.announce(run_id)
    messages, taken = 0, 0
    # (arrival, paths taken by then), from the first arrival after warm_s
    points: list[tuple[float, int]] = []
    generate: list[float] = []  # seconds in the engine of each group after the first arrival
    try:
        start = time.monotonic()
        warm, give_up = start + warm_s, start + warm_s + seconds + 600
        while time.monotonic() < give_up:
            arrived = groups.read(count=256, block_ms=200)
            now = time.monotonic()
            for d in arrived:
                group = common_pb2.PathGroup.FromString(d.data)
                groups.ack_and_delete(d.entry_id)
                messages += 1
                taken += len(group.paths)
                if points:
                    generate.append(group.generate_seconds)
            if arrived and now >= warm:
                points.append((now, taken))
                if now - points[0][0] >= seconds:
                    break
            feed.top_up(messages // parts, at)
    finally:
        registry.retire(run_id)
        channels.clear_prompts()
        channels.expire(60)
    if len(points) < 2 or points[-1][0] - points[0][0] < seconds:
        raise RuntimeError(
            f"the workers published too few groups in {time.monotonic() - start:.0f} s"
        )
    slope = statistics.linear_regression([t for t, _ in points], [n for _, n in points]).slope
    return slope, statistics.fmean(generate)
