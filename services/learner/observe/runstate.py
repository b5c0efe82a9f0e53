"""A run's observable state: metrics (JSONL on disk + in memory for WatchRun, and every sink of
services/learner/observe/sinks.py: TensorBoard, Prometheus, W&B, MLflow), sample completions,
status."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from brorl.v1 import common_pb2
from services.learner.observe.samples_log import write_samples
from services.learner.observe.sinks import Fanout, Sink


class RunState:
    def __init__(self, run_id: str, run_dir: Path, total_steps: int, sinks: list[Sink] = ()):
        self.run_id = run_id
        self.run_dir = run_dir
        self.total_steps = total_steps
        self.state = "running"
        self.message = ""
        self.step = 0
        self.weight_version = 0
        self.last: dict[str, float] = {}
        self._metrics: list[common_pb2.Metric] = []
        self._cond = threading.Condition()
        self._file = open(run_dir / "metrics.jsonl", "a", buffering=1)
        self.stop_requested = threading.Event()
        self.checkpoint_requested = threading.Event()
        self.checkpoint_done = threading.Condition()
        self.last_checkpoint: tuple[str, int] | None = None
        self.sinks = Fanout(sinks)

    def emit(
        self,
        values: dict[str, float],
        event: str = "",
        message: str = "",
        extra: dict | None = None,
        step: int | None = None,
    ) -> None:
        """Record metrics; ``extra`` (e.g. the group ids of a step) goes to metrics.jsonl only;
        ``step`` (default: the current one) is the step the values belong to."""
        step = self.step if step is None else step
        metric = common_pb2.Metric(
            run_id=self.run_id,
            step=step,
            time=time.time(),
            values={k: float(v) for k, v in values.items()},
            event=event,
            message=message,
        )
        self._file.write(
            json.dumps(
                {
                    "step": step,
                    "time": metric.time,
                    "event": event,
                    "message": message,
                    **metric.values,
                    **(extra or {}),
                }
            )
            + "\n"
        )
        self.sinks.scalars(self.step, dict(metric.values))
        with self._cond:
            self.last.update(metric.values)
            self._metrics.append(metric)
            self._cond.notify_all()

    def samples(self, groups: list[common_pb2.PathGroup], every: int) -> None:
        """The step's sample completions every ``every`` steps: samples.jsonl and the sinks."""
        self.sinks.samples(self.step, write_samples(self.run_dir, self.step, groups, every))

    def finish(self, state: str, message: str = "") -> None:
        self.state, self.message = state, message
        self.emit({}, event="done" if state == "finished" else state, message=message)
        self._file.close()
        self.sinks.close()

    @property
    def ended(self) -> bool:
        return self.state != "running"

    def watch(self, from_step: int = 0, is_active=lambda: True):
        """Yield metrics with step >= from_step, then new ones as they come, until the run ends."""
        index = 0
        while True:
            with self._cond:
                while index >= len(self._metrics) and not self.ended and is_active():
                    self._cond.wait(timeout=1.0)
                batch = self._metrics[index:]
                index = len(self._metrics)
                ended = self.ended
            for m in batch:
                if m.step >= from_step:
                    yield m
            if (ended and index >= len(self._metrics)) or not is_active():
                return
