"""Monitor alarms through the real learner loop (services/learner/guard/actions.py): warn, stop and
rollback, driven by an in-memory queue, a fake rollout whose rewards depend on the published
weights, and a one-number policy whose checkpoints can be restored."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from brorl.config.run import RunConfig
from brorl.v1 import common_pb2
from brorl.weights.store import WeightStore
from services.learner.observe.runstate import RunState
from services.learner.train import Trainer
from tests.memory_queue import MemoryChannels, MemoryRegistry


class ScalarPolicy:
    """A policy whose weights are one number ``w``: each update adds the learning rate."""

    def __init__(self, lr: float, kl=lambda step: 0.01):
        self.w, self.lr, self.kl_coef, self.kl, self.updates = 0.0, lr, 0.0, kl, 0
        self.set_calls: list[tuple[float, float]] = []

    def warm_forward(self, paths: int, length: int) -> float:
        return 0.0

    def update(self, groups) -> dict[str, float]:
        self.updates += 1
        self.w += self.lr
        return {
            "learner/loss": 0.0,
            "learner/kl": self.kl(self.updates),
            "learner/entropy": 1.0,
            "learner/nonzero_paths": float(sum(len(g.paths) for g in groups)),
        }

    def weights(self) -> dict[str, np.ndarray]:
        return {"w": np.array([self.w], dtype=np.float32)}

    def export(self, out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        return out

    def save_checkpoint(self, directory: str, tag: str, client_state: dict) -> None:
        Path(directory, tag).mkdir(parents=True, exist_ok=True)
        Path(directory, tag, "w.json").write_text(json.dumps({"w": self.w, "lr": self.lr}))

    def load_checkpoint(self, directory: str, tag: str | None = None) -> dict:
        saved = json.loads(Path(directory, tag, "w.json").read_text())
        self.w, self.lr = saved["w"], saved["lr"]  # the optimizer state holds the lr
        return {}

    def set_hyperparameters(self, lr: float, kl_coef: float) -> None:
        self.lr, self.kl_coef = lr, kl_coef
        self.set_calls.append((lr, kl_coef))


def weights_of(pointer: common_pb2.WeightVersion) -> float:
    """The one number of a published version (every version an fp32 keyframe here)."""
    from safetensors.numpy import load_file

    return float(load_file(str(Path(pointer.uri, "model.safetensors")))["w"][0])


def gamed_rollout(hack_from: float):
    """Paths of the newest published weights w: the training reward is 0.1·w (it keeps paying),
    the verifier agrees up to w = ``hack_from`` and falls after it (the policy games the
    reward). Each group holds a right and a wrong path around that mean."""

    def answer(ch: MemoryChannels) -> None:
        pointer = ch.read_weights()
        w = weights_of(pointer)
        reward = 0.1 * w
        verifier = 0.1 * min(w, hack_from) - 0.15 * max(w - hack_from, 0.0)
        while ch.prompts.new:
            [d] = ch.prompts.read(count=1)
            job = common_pb2.PromptJob.FromString(d.data)
            group = common_pb2.PathGroup(
                run_id=ch.run_id,
                group_id=job.group_id,
                prompt_id=job.prompt_id,
                prompt_token_ids=[3, 4],
                weight_version=pointer.version,
                generated=job.sampling.n,
            )
            for i in range(job.sampling.n):
                sign = 1 if i % 2 else -1
                group.paths.add(
                    path_id=f"{job.group_id}/{i}",
                    group_id=job.group_id,
                    token_ids=[5, 6],
                    logprobs=[-0.5, -0.5],
                    reward=reward + 0.05 * sign,
                    verifier_reward=verifier + 0.05 * sign,
                    verifier_status="ok" if job.verifier_fn else "",
                    weight_version=pointer.version,
                    sampling=job.sampling,
                    worker="w0",
                )
            ch.paths.put(group.SerializeToString())
            ch.prompts.ack(d.entry_id)

    return answer


def run(tmp_path, monitors: dict, steps=12, hack_from=4.0, kl=lambda step: 0.01, lag=0):
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i}+1=", "reference": str(i + 1)}) + "\n" for i in range(9))
    )
    cfg = RunConfig.model_validate(
        {
            "model": str(tmp_path),
            "data": {"train_path": str(data)},
            "sampling": {"n": 4, "top_k": -1, "top_p": 1.0},
            "train": {"steps": steps, "groups_per_step": 1, "lr": 1.0, "kl_coef": 0.01},
            # versions reach the fake rollout within the step, so the rollback horizon (paths of
            # weights at most window + 1 steps old) is exact
            "async": {
                "max_inflight_groups": 1,
                "group_timeout_s": 5,
                "publish_in_background": False,
                "publish_lag": lag,
                "max_staleness": 2 + lag,
            },
            "checkpoint_every": 1,
            "weights": {"serving_dtype": "fp32", "keyframe_every": 1},
            "monitors": monitors,
        }
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    channels, policy = MemoryChannels("r1", gamed_rollout(hack_from)), ScalarPolicy(1.0, kl)
    state = RunState("r1", run_dir, steps)
    trainer = Trainer(
        "r1",
        cfg,
        state,
        channels,
        MemoryRegistry(),
        WeightStore(tmp_path / "weights"),
        lambda: policy,
        keep_versions=100,
    )
    trainer.run()
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return trainer, policy, channels, records


HACKING = {"verifier_fn": "exact", "verifier_sample": 1.0, "window": 3}


def events(records, kind):
    return [r for r in records if r["event"] == kind]


def test_warn_records_the_alarm_and_trains_on(tmp_path):
    trainer, policy, channels, records = run(tmp_path, {**HACKING, "action": "warn"})
    alarms = events(records, "alarm")
    assert alarms and all(a["message"].startswith("reward_hacking:") for a in alarms)
    steps = [r for r in records if "learner/loss" in r]
    assert len(steps) == 12 and steps[-1]["monitor/alarms"] == len(alarms)
    first = alarms[0]["step"]
    assert steps[first - 1]["monitor/alarm/reward_hacking"] == 1.0
    assert all("monitor/alarm/reward_hacking" not in s for s in steps[: first - 1])
    # nothing rolled back: one version per step, weights only grew
    assert [p.version for p in channels.pointers] == list(range(13))
    assert not events(records, "rollback") and policy.set_calls == []


def test_stop_ends_the_run_at_the_alarm_with_a_message(tmp_path):
    trainer, policy, _, records = run(tmp_path, {**HACKING, "action": "stop"})
    [alarm] = events(records, "alarm")
    assert trainer.step == alarm["step"] < 12
    assert trainer.state.stop_requested.is_set()
    assert trainer.guard.stop_message.startswith(f"stopped by monitor alarm at step {trainer.step}")
    assert "reward_hacking" in trainer.guard.stop_message


def test_rollback_restores_a_passed_checkpoint_and_republishes_it(tmp_path):
    trainer, policy, channels, records = run(
        tmp_path, {**HACKING, "action": "rollback", "lr_factor": 0.5, "kl_factor": 3.0}
    )
    alarm, rollback = events(records, "alarm")[0], events(records, "rollback")[0]
    assert rollback["step"] == alarm["step"]
    ledger = json.loads((trainer.ckpt_dir / "monitors.json").read_text())
    assert ledger["checkpoints"]["step0000000"] == {"step": 0, "passed": True}  # written at start
    assert ledger["checkpoints"][f"step{alarm['step']:07d}"]["passed"] is False
    # the target: the newest checkpoint whose weights no alarm read (window 3: the alarm's
    # steps hold paths of the weights from 4 steps back on); none after it up to the alarm passed
    tag = rollback["message"].split("rolled back to checkpoint ")[1].split()[0]
    target_step = ledger["checkpoints"][tag]["step"]
    assert ledger["checkpoints"][tag]["passed"] and target_step == alarm["step"] - 4
    assert not any(
        e["passed"]
        for e in ledger["checkpoints"].values()
        if target_step < e["step"] <= alarm["step"]
    )
    # the restored weights are a new version above every published one, equal to the
    # checkpoint's; the lr is halved and the KL coefficient tripled
    versions = [p.version for p in channels.pointers]
    restored = next(p for p in channels.pointers if p.version == rollback["learner/weight_version"])
    assert restored.version == max(versions[: versions.index(restored.version)]) + 1
    saved = json.loads((trainer.ckpt_dir / tag / "w.json").read_text())
    assert weights_of(restored) == saved["w"] == target_step * 1.0
    # k-th rollback: lr × 0.5^k, kl_coef × 3^k (this run rolls back twice)
    assert policy.set_calls[:2] == [(0.5, 0.03), pytest.approx((0.25, 0.09))]
    # groups sampled by the abandoned weights were dropped, not trained on
    last = [r for r in records if "learner/loss" in r][-1]
    assert last["monitor/rollbacks"] == len(events(records, "rollback")) >= 1


def test_the_rollback_goes_back_past_the_oldest_weights_the_alarm_read(tmp_path):
    """With a publish lag of 2 the window's paths are 2-3 versions old: the weights of the
    oldest ones (and every checkpoint after them) are suspect, so the target is older than the
    step s - window - 1 that paths of the newest weights would give (which read hacked paths)."""
    trainer, _, _, records = run(tmp_path, {**HACKING, "action": "rollback"}, lag=2)
    alarm, rollback = events(records, "alarm")[0], events(records, "rollback")[0]
    steps = {r["step"]: r for r in records if "learner/loss" in r and r["step"] <= alarm["step"]}
    window = [steps[s] for s in range(alarm["step"] - HACKING["window"] + 1, alarm["step"] + 1)]
    oldest = min(r["learner/oldest_version"] for r in window)
    assert oldest <= window[-1]["learner/weight_version"] - 3  # the lag shows in the metric
    holds = min(s for s, r in steps.items() if r["learner/weight_version"] >= oldest)
    ledger = json.loads((trainer.ckpt_dir / "monitors.json").read_text())
    tag = rollback["message"].split("rolled back to checkpoint ")[1].split()[0]
    target_step = ledger["checkpoints"][tag]["step"]
    assert target_step == holds - 1 < alarm["step"] - HACKING["window"] - 1
    read = [e for e in ledger["checkpoints"].values() if holds <= e["step"] <= alarm["step"]]
    assert read and not any(e["passed"] for e in read)


def test_rollbacks_are_bounded_then_the_run_stops(tmp_path):
    trainer, _, _, records = run(
        tmp_path, {**HACKING, "action": "rollback", "max_rollbacks": 1}, steps=40
    )
    assert len(events(records, "rollback")) == 1
    assert "after 1 rollbacks" in trainer.guard.stop_message
    assert trainer.step < 40


def test_a_kl_spike_alarms_at_its_step(tmp_path):
    spike = {"window": 4, "kl_spike": 3.0, "kl_floor": 1e-3, "action": "warn"}
    _, _, _, records = run(tmp_path, spike, kl=lambda step: 0.05 if step == 7 else 0.01)
    assert [a["step"] for a in events(records, "alarm")] == [7]
    assert events(records, "alarm")[0]["message"].startswith("kl_spike: 0.05 is 5x")


def test_groups_of_weights_a_rollback_abandoned_are_dropped(tmp_path):
    import threading

    from brorl.config.run import AsyncConfig
    from services.learner.intake.collect import GroupIntake
    from tests.memory_queue import MemoryStreamQueue

    queue = MemoryStreamQueue()
    intake = GroupIntake(queue, AsyncConfig(max_staleness=4))
    intake.min_version = 5  # a rollback published version 5
    for i, version in enumerate([3, 5, 1, 4, 6]):  # version 1 is stale as well (6 - 1 > 4)
        group = common_pb2.PathGroup(group_id=f"g{i}", weight_version=version)
        for k, reward in enumerate([1.0, 0.0]):
            group.paths.add(path_id=f"g{i}/{k}", reward=reward, token_ids=[1])
        queue.put(group.SerializeToString())
    got = intake.collect(2, version=6, stop=threading.Event())
    outcomes = [c.outcome for c in got.consumed]
    assert outcomes == ["rolled_back", "used", "stale", "rolled_back", "used"]
