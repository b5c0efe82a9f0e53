"""Where a run's metrics go besides metrics.jsonl (services/learner/observe/sinks.py): the real
training loop (in-memory queue, recording policy) writes TensorBoard event files whose scalars
are every metric of metrics.jsonl, step by step, and whose text holds the sample completions;
the learner's Prometheus gauges follow the steps; a tracker enabled but not installed is
INVALID_ARGUMENT; a sink that fails is dropped without failing the run."""

from __future__ import annotations

import json
import math
import sys

import grpc
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from brorl.errors import InvalidArgument
from brorl.metrics import Metrics
from brorl.config.tracking import LoggingConfig
from brorl.config.run import RunConfig
from brorl.weights.store import WeightStore
from services.learner.observe.live_metrics import StepGauges
from services.learner.observe.runstate import RunState
from services.learner.observe.sinks import (
    SAMPLES_TAG,
    TENSORBOARD_DIR,
    Fanout,
    build_sinks,
    check_trackers,
)
from services.learner.observe.samples_log import samples_markdown
from services.learner.train import Trainer
from tests.memory_queue import MemoryChannels, MemoryRegistry
from tests.unit.services.learner.test_trainer_loop import RecordingPolicy, fake_rollout, mixed


def train(tmp_path, sinks_of, steps=4, samples_every=2):
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i}+1=", "reference": "x"}) + "\n" for i in range(9))
    )
    cfg = RunConfig.model_validate(
        {
            "model": str(tmp_path),
            "data": {"train_path": str(data)},
            "sampling": {"n": 4, "top_k": -1, "top_p": 1.0},
            "train": {"steps": steps, "groups_per_step": 2},
            "async": {"max_inflight_groups": 4, "group_timeout_s": 5},
            "samples_every": samples_every,
        }
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    state = RunState("r1", run_dir, steps, sinks_of(cfg, run_dir))
    Trainer(
        "r1",
        cfg,
        state,
        MemoryChannels("r1", fake_rollout(mixed)),
        MemoryRegistry(),
        WeightStore(tmp_path / "weights"),
        RecordingPolicy,
    ).run()
    state.finish("finished")
    return run_dir


def events(run_dir) -> EventAccumulator:
    acc = EventAccumulator(
        str(run_dir / TENSORBOARD_DIR), size_guidance={"scalars": 0, "tensors": 0}
    )
    acc.Reload()
    return acc


def test_tensorboard_has_every_metric_of_metrics_jsonl_and_the_samples(tmp_path):
    run_dir = train(
        tmp_path, lambda cfg, run_dir: build_sinks(cfg.logging, "r1", run_dir, {}), steps=4
    )
    acc = events(run_dir)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    expected: dict[str, dict[int, float]] = {}
    for line in lines:
        for key, value in line.items():
            if key not in ("step", "time", "event", "message", "groups", "group_paths"):
                expected.setdefault(key, {})[line["step"]] = value
    assert {"learner/loss", "learner/wait_s", "reward/mean", "learner/weight_version"} <= set(
        expected
    )
    assert set(acc.Tags()["scalars"]) == set(expected)
    for key, by_step in expected.items():
        got = {e.step: e.value for e in acc.Scalars(key)}
        assert got.keys() == by_step.keys(), key
        assert all(math.isclose(got[s], v, rel_tol=1e-6, abs_tol=1e-6) for s, v in by_step.items())
    assert sorted(e.step for e in acc.Scalars("learner/loss")) == [1, 2, 3, 4]

    texts = acc.Tensors(f"{SAMPLES_TAG}/text_summary")
    assert [t.step for t in texts] == [2, 4]  # samples_every: 2
    table = texts[0].tensor_proto.string_val[0].decode()
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert table == samples_markdown(samples[0]["samples"])
    assert "| best |" in table and samples[0]["samples"][0]["prompt"] in table


def test_tensorboard_can_be_turned_off(tmp_path):
    off = LoggingConfig.model_validate({"tensorboard": {"enabled": False}})
    run_dir = train(tmp_path, lambda cfg, run_dir: build_sinks(off, "r1", run_dir, {}), steps=1)
    assert not (run_dir / TENSORBOARD_DIR).exists()


def test_samples_markdown_keeps_one_row_per_sample():
    table = samples_markdown(
        [{"kind": "best", "reward": 1.0, "prompt": "a|b", "text": "line1\nline2"}]
    )
    assert table.splitlines()[2] == "| best | 1 | a\\|b | line1<br>line2 |"


def test_step_gauges_follow_the_run(tmp_path):
    metrics = Metrics()
    gauges = StepGauges(metrics)
    train(tmp_path, lambda cfg, run_dir: [gauges], steps=3)
    value = metrics.registry.get_sample_value
    assert value("brorl_learner_step") == 3
    assert value("brorl_learner_weight_version") == 3
    assert value("brorl_learner_reward_mean") is not None
    for phase in ("wait", "update", "publish", "step"):
        assert value("brorl_learner_step_seconds", {"phase": phase}) >= 0, phase
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    last = [line for line in lines if "learner/loss" in line][-1]
    assert value("brorl_learner_metric", {"key": "learner/step_s"}) == last["learner/step_s"]
    assert value("brorl_learner_metric", {"key": "reward/mean"}) == last["reward/mean"]


@pytest.mark.parametrize("package", ["wandb", "mlflow"])
def test_a_tracker_enabled_but_not_installed_is_invalid_argument(monkeypatch, package):
    monkeypatch.setitem(sys.modules, package, None)  # what an absent package looks like
    cfg = LoggingConfig.model_validate({package: {"enabled": True}})
    with pytest.raises(InvalidArgument) as err:
        check_trackers(cfg)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"logging.{package}.enabled" in str(err.value)
    assert f"pip install {package}" in str(err.value)
    check_trackers(LoggingConfig())  # nothing enabled: nothing to import


def test_a_failing_sink_is_dropped_and_the_others_keep_going():
    class Broken:
        def scalars(self, step, values):
            raise OSError("disk full")

    class Recording:
        def __init__(self):
            self.seen = []

        def scalars(self, step, values):
            self.seen.append(step)

        def samples(self, step, samples):
            pass

        def close(self):
            pass

    good = Recording()
    fan = Fanout([Broken(), good])
    fan.scalars(1, {"a": 1.0})
    fan.scalars(2, {"a": 1.0})
    fan.scalars(3, {})  # an event without values goes nowhere
    assert good.seen == [1, 2] and len(fan.sinks) == 1
    fan.close()


@pytest.mark.parametrize("package", ["wandb", "mlflow"])
def test_start_run_answers_invalid_argument_before_writing_anything(tmp_path, monkeypatch, package):
    """StartRun over a real loopback port (no Redis: the run never gets that far)."""
    from brorl import rpc
    from brorl.config.base import validate
    from brorl.v1 import learner_pb2, learner_pb2_grpc
    from services.learner.config import LearnerServiceConfig
    from services.learner.server import SERVICE_NAME, LearnerServicer

    monkeypatch.setitem(sys.modules, package, None)
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "reference": "2"}) + "\n")
    cfg = validate(
        LearnerServiceConfig,
        {"bind": "127.0.0.1:0", "runs_dir": str(tmp_path / "runs"), "read_roots": [str(tmp_path)]},
    )
    server = rpc.Server(cfg.bind, [SERVICE_NAME], metrics=Metrics())
    learner_pb2_grpc.add_LearnerServiceServicer_to_server(
        LearnerServicer(cfg, redis_client=None), server.grpc
    )
    server.start().set_serving(True)
    config = json.dumps(
        {
            "model": str(tmp_path),
            "data": {"train_path": str(data)},
            "logging": {package: {"enabled": True}},
        }
    )
    try:
        stub = learner_pb2_grpc.LearnerServiceStub(rpc.channel(f"127.0.0.1:{server.port}"))
        with pytest.raises(grpc.RpcError) as err:
            stub.StartRun(learner_pb2.StartRunRequest(config_yaml=config, run_id="r1"), timeout=10)
    finally:
        server.stop(0)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"logging.{package}.enabled" in err.value.details()
    assert f"pip install {package}" in err.value.details()
    assert not (tmp_path / "runs" / "r1").exists()
    codes = {"service": "brorl.v1.LearnerService", "method": "StartRun", "code": "INVALID_ARGUMENT"}
    assert server.metrics.registry.get_sample_value("brorl_rpc_requests_total", codes) == 1
