"""Experiment trackers a user installs and enables in the run config's ``logging`` section:
Weights & Biases and MLflow (docs/observability.md). Both are optional packages, imported only
here and only when enabled (services/learner/observe/sinks.py checks they are installed first).

Offline by default, so a run logs without network: W&B's ``offline`` mode writes
``<run_dir>/wandb`` (``wandb sync`` uploads it later), MLflow without a tracking server writes a
file store in ``<run_dir>/mlruns``."""

from __future__ import annotations

import os
import time
from pathlib import Path

from brorl.config.tracking import MlflowConfig, WandbConfig
from services.learner.observe.samples_log import samples_markdown


class WandbSink:
    def __init__(self, cfg: WandbConfig, run_id: str, run_dir: Path, config: dict):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity or None,
            name=run_id,
            id=run_id,  # a resumed run continues the same W&B run
            resume="allow",
            dir=str(run_dir),
            mode=cfg.mode,
            config=config,
            # The learner's stdout is its service log: W&B must not wrap it.
            settings=wandb.Settings(console="off", silent=True),
        )

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def samples(self, step: int, samples: list[dict]) -> None:
        columns = ["kind", "reward", "prompt", "completion"]
        rows = [[s["kind"], s["reward"], s["prompt"], s["text"]] for s in samples]
        self.run.log({"samples": self.wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()
        # finish() returns once the run's exit record is acknowledged, while W&B's service
        # process may still be writing the offline transaction log; teardown waits for that
        # process to exit, so <run_dir>/wandb is complete when the run ends.
        self.wandb.teardown()


class MlflowSink:
    """Through an ``MlflowClient`` of its own (not mlflow's process-wide active run): metrics by
    step, the run config as parameters, each step's samples as a markdown artifact."""

    def __init__(self, cfg: MlflowConfig, run_id: str, run_dir: Path, config: dict):
        import mlflow
        from mlflow.entities import Metric, Param

        uri = cfg.tracking_uri
        if not uri:
            uri = (run_dir / "mlruns").resolve().as_uri()
            # MLflow 3 refuses its file store unless told it is wanted; a database store would
            # need the full mlflow package (SQLAlchemy), the file store works with mlflow-skinny.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.Metric = Metric
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(cfg.experiment)
        if experiment is None:
            experiment_id = self.client.create_experiment(cfg.experiment)
        else:
            experiment_id = experiment.experiment_id
        self.run_id = self.client.create_run(experiment_id, run_name=run_id).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in _flat(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def scalars(self, step: int, values: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = [self.Metric(k, float(v), now, step) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics a batch
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def samples(self, step: int, samples: list[dict]) -> None:
        self.client.log_text(self.run_id, samples_markdown(samples), f"samples/step{step:07d}.md")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flat(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
