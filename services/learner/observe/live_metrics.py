"""The learner's Prometheus series (docs/observability.md): the last step's metrics as gauges
(a sink of RunState, services/learner/observe/sinks.py) and, read at every scrape, the depth of the
current run's prompt and path streams."""

from __future__ import annotations

import re
from typing import Callable

from brorl.metrics import Metrics, Sample
from brorl.queue import RunChannels

_PHASE = re.compile(r"^learner/([a-z_]+)_s$")  # learner/wait_s, learner/forward_s, ...


class StepGauges:
    """Sets the learner's gauges from each emitted metrics dict (one run at a time: the
    gauges show the run in progress, or the last one)."""

    def __init__(self, metrics: Metrics):
        self.step = metrics.gauge("learner_step", "Updates done in the current run")
        self.version = metrics.gauge(
            "learner_weight_version", "Weight version the learner published last"
        )
        self.reward_mean = metrics.gauge(
            "learner_reward_mean", "Mean reward of the paths of the last update"
        )
        self.phase = metrics.gauge(
            "learner_step_seconds",
            "Seconds of the last step by phase: wait (for groups), update (= batch + forward + "
            "backward + optimizer), publish (weights, checkpoint), step (all)",
            ("phase",),
        )
        self.value = metrics.gauge(
            "learner_metric", "Every metric of the last step, by its metrics.jsonl key", ("key",)
        )

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.step.set(step)
        for key, value in values.items():
            self.value.labels(key).set(value)
            if phase := _PHASE.match(key):
                self.phase.labels(phase.group(1)).set(value)
        if "learner/weight_version" in values:
            self.version.set(values["learner/weight_version"])
        if "learner/reward_mean" in values:
            self.reward_mean.set(values["learner/reward_mean"])

    def samples(self, step: int, samples: list[dict]) -> None:
        pass  # texts are not series

    def close(self) -> None:
        pass  # the last run's values stay until the next run sets them


def queue_samples(current: Callable[[], RunChannels | None]) -> list[Sample]:
    """Length, lag and pending entries of the current run's streams ([] when no run is on)."""
    channels = current()
    if channels is None:
        return []
    docs = {
        "length": "Entries in the run's stream (XLEN)",
        "lag": "Entries not yet delivered to the stream's consumer group",
        "pending": "Entries delivered to a consumer and not yet acked",
    }
    return [
        Sample(f"queue_{what}", docs[what], value, {"run": channels.run_id, "stream": stream})
        for stream, stats in channels.stream_stats().items()
        for what, value in stats.items()
    ]
