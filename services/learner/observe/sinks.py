"""Where a run's metrics go besides metrics.jsonl and WatchRun: the sinks RunState hands every
emitted metric and every step's sample completions to (docs/observability.md).

* TensorBoard event files in ``<run_dir>/tensorboard`` (torch.utils.tensorboard; on by default);
* the learner's Prometheus gauges (services/learner/observe/live_metrics.py);
* Weights & Biases and MLflow when the run config enables them
  (services/learner/observe/trackers.py).

``build_sinks`` runs in StartRun: an enabled tracker whose package is not installed is the
caller's error (INVALID_ARGUMENT), reported before the run starts. A sink that fails later is
logged and dropped; it never fails the run.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Protocol

from brorl.errors import FailedPrecondition, InvalidArgument
from brorl.config.tracking import LoggingConfig
from services.learner.observe.samples_log import samples_markdown

log = logging.getLogger(__name__)

TENSORBOARD_DIR = "tensorboard"
SAMPLES_TAG = "samples"


class Sink(Protocol):
    def scalars(self, step: int, values: dict[str, float]) -> None: ...

    def samples(self, step: int, samples: list[dict]) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    """Scalars by step under their metric names; samples as a text table under ``samples``."""

    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.writer = SummaryWriter(str(log_dir))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # a step is seconds apart: readers see it at once

    def samples(self, step: int, samples: list[dict]) -> None:
        self.writer.add_text(SAMPLES_TAG, samples_markdown(samples), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def require_installed(package: str, section: str) -> None:
    """INVALID_ARGUMENT naming ``section`` when ``package`` is not importable by the learner."""
    if importlib.util.find_spec(package) is None:
        raise InvalidArgument(
            section,
            f"is true but {package} is not installed in the learner's environment; "
            f"`pip install {package}` there (or set {section}: false)",
        )


def check_trackers(logging_cfg: LoggingConfig) -> None:
    """INVALID_ARGUMENT when the run config enables a tracker the learner cannot import."""
    for name, section in (("wandb", logging_cfg.wandb), ("mlflow", logging_cfg.mlflow)):
        if section.enabled:
            require_installed(name, f"logging.{name}.enabled")


def build_sinks(
    logging_cfg: LoggingConfig, run_id: str, run_dir: Path, config: dict, extra=()
) -> list[Sink]:
    """The run's sinks: ``extra`` (the learner's Prometheus gauges), then what ``logging_cfg``
    enables. ``config`` (the resolved run config) goes to the trackers as the run's parameters.
    A tracker that cannot start (e.g. W&B online without network) is FAILED_PRECONDITION."""
    check_trackers(logging_cfg)
    sinks: list[Sink] = list(extra)
    if logging_cfg.tensorboard.enabled:
        sinks.append(TensorBoardSink(run_dir / TENSORBOARD_DIR))
    from services.learner.observe import trackers  # imports the trackers' packages only when built

    for name, section, make in (
        ("wandb", logging_cfg.wandb, lambda: trackers.WandbSink),
        ("mlflow", logging_cfg.mlflow, lambda: trackers.MlflowSink),
    ):
        if not section.enabled:
            continue
        try:
            sinks.append(make()(section, run_id, run_dir, config))
        except Exception as exc:  # noqa: BLE001 - any failure of a third-party start-up
            Fanout(sinks).close()
            raise FailedPrecondition(
                f"logging.{name}: could not start ({type(exc).__name__}: {exc}); check its "
                f"settings or set logging.{name}.enabled: false"
            ) from None
    return sinks


class Fanout:
    """Hands every call to each sink; one that raises is logged once and dropped."""

    def __init__(self, sinks: list[Sink]):
        self.sinks = list(sinks)

    def _each(self, method: str, *args) -> None:
        for sink in list(self.sinks):
            try:
                getattr(sink, method)(*args)
            except Exception:  # noqa: BLE001 - a dashboard must not fail the training run
                log.exception("%s.%s failed; it gets no more metrics", type(sink).__name__, method)
                self.sinks.remove(sink)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if values:
            self._each("scalars", step, values)

    def samples(self, step: int, samples: list[dict]) -> None:
        if samples:
            self._each("samples", step, samples)

    def close(self) -> None:
        self._each("close")
