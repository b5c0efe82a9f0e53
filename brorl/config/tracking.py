"""The ``logging`` section of a run config: where the learner sends a run's metrics besides
``metrics.jsonl`` and WatchRun (docs/observability.md). TensorBoard is on by default; Weights &
Biases and MLflow are optional packages the user installs in the learner's environment and
enables here (the learner answers INVALID_ARGUMENT when an enabled one is not installed)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from brorl.config.base import StrictModel


class TensorBoardConfig(StrictModel):
    enabled: bool = Field(
        True,
        description="Write every metric and the sample completions as TensorBoard events in "
        "<run_dir>/tensorboard (`tensorboard --logdir <run_dir>/tensorboard`).",
    )


class WandbConfig(StrictModel):
    enabled: bool = Field(False, description="Log the run to Weights & Biases (pip install wandb).")
    project: str = Field("brorl", min_length=1, description="W&B project of the run.")
    entity: str = Field("", description="W&B entity (team or user); '' : the account's default.")
    mode: Literal["offline", "online"] = Field(
        "offline",
        description="offline: write the run under <run_dir>/wandb only, no network (upload it "
        "later with `wandb sync`); online: stream it to the W&B server.",
    )


class MlflowConfig(StrictModel):
    enabled: bool = Field(False, description="Log the run to MLflow (pip install mlflow).")
    tracking_uri: str = Field(
        "",
        pattern=r"^(|https?://.+)$",
        description="An MLflow tracking server (http:// or https://); '' : a file store in "
        "<run_dir>/mlruns, no network (`mlflow ui --backend-store-uri <run_dir>/mlruns`). "
        "Other URIs are refused: a run config may not make the learner write elsewhere.",
    )
    experiment: str = Field("brorl", min_length=1, description="MLflow experiment of the run.")


class LoggingConfig(StrictModel):
    tensorboard: TensorBoardConfig = Field(
        default_factory=TensorBoardConfig, description="TensorBoard event files."
    )
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="Weights & Biases.")
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig, description="MLflow tracking.")
