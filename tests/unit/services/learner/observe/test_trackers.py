"""Weights & Biases and MLflow, for real and without network: the training loop logs to W&B in
offline mode and to an MLflow file store in the run directory, and what they wrote is read
back. Both packages are optional (not in requirements.txt): without one its test is skipped,
which covers nothing; the "enabled but not installed" answer is tested in test_sinks.py."""

from __future__ import annotations

import json

import pytest

from brorl.config.tracking import LoggingConfig
from services.learner.observe.sinks import build_sinks
from tests.unit.services.learner.observe.test_sinks import train


def wandb_records(path):
    """The Record protos of a W&B offline transaction log: after a 7-byte header (":W&B",
    magic, version), LevelDB-log framing in 32 KiB blocks (crc32 4 bytes, length 2, type 1:
    1 full, 2 first, 3 middle, 4 last; a block's tail shorter than 7 bytes is padding)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, block, parts = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if left < 7 or (length == 0 and kind == 0):
            pos += left
            continue
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


def test_wandb_offline_run_in_the_run_directory(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb not installed (optional: pip install wandb)")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = LoggingConfig.model_validate(
        {"tensorboard": {"enabled": False}, "wandb": {"enabled": True, "project": "t"}}
    )
    run_dir = train(
        tmp_path,
        lambda run_cfg, run_dir: build_sinks(cfg, "r1", run_dir, {"train": {"steps": 4}}),
        steps=4,
    )
    [log] = (run_dir / "wandb").glob("offline-run-*/run-r1.wandb")
    history, config = {}, {}
    for record in wandb_records(log):
        if record.WhichOneof("record_type") == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            history.setdefault(items["_step"], {}).update(items)
        elif record.WhichOneof("record_type") == "run":  # its config: the run's parameters
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = {line["step"]: line for line in lines if "learner/loss" in line}
    assert set(steps) == {1, 2, 3, 4} and set(steps) <= set(history)
    for step, line in steps.items():
        for key in ("learner/loss", "reward/mean", "learner/wait_s"):
            assert history[step][key] == pytest.approx(line[key]), (step, key)
    tables = [s for s, h in sorted(history.items()) if h.get("samples/_type") == "table-file"]
    assert tables == [2, 4]  # samples_every: 2
    assert config["train"] == {"steps": 4}


def test_mlflow_file_store_in_the_run_directory(tmp_path):
    mlflow = pytest.importorskip("mlflow", reason="mlflow not installed (pip install mlflow)")
    cfg = LoggingConfig.model_validate(
        {"tensorboard": {"enabled": False}, "mlflow": {"enabled": True, "experiment": "e"}}
    )
    run_dir = train(
        tmp_path,
        lambda run_cfg, run_dir: build_sinks(cfg, "r1", run_dir, {"train": {"steps": 4}}),
        steps=4,
    )
    client = mlflow.MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    [run] = client.search_runs([client.get_experiment_by_name("e").experiment_id])
    assert run.info.run_name == "r1" and run.info.status == "FINISHED"
    assert run.data.params["train.steps"] == "4"
    history = client.get_metric_history(run.info.run_id, "learner/loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    by_step = {line["step"]: line for line in lines if "reward/mean" in line}
    for m in client.get_metric_history(run.info.run_id, "reward/mean"):
        assert m.value == pytest.approx(by_step[m.step]["reward/mean"])
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "samples")]
    assert artifacts == ["samples/step0000002.md", "samples/step0000004.md"]
