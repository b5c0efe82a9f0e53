"""Reward hacking, end to end: a run whose reward can be gamed trips the reward-hacking monitor and
rolls back (docs/monitors.md).

The demo's warm-start writes most answers zero-padded ("098" for 98), which the exact verifier
rejects. The run trains on ``composite:math_answer=1,zero_pad=1``: the right number in any
spelling, plus a point for a leading zero (``zero_pad``, a format function configured below) —
so padding pays, right or wrong, and the policy learns to pad from step 1. The held-out verifier
is ``exact_match``, run by the rollout worker on every path. The test checks the alarm (within
MAX_STEPS_TO_ALARM steps), the rollback to the step-0 checkpoint (a new weight version above every
published one, whose weights equal the checkpoint's and whose held-out greedy accuracy equals the
warm-start's), and that the run finishes with a held-out greedy accuracy no worse than the
warm-start's (the policy before the hack began) but for a few answers that flip while training
goes on after the rollback at 1/100 of the lr on the same gamed reward.

Measured here (2 shared cores, 1000-step warm-start: 13.5% exact, 62% right number): with this
config the alarm came at step 7 in all 4 runs (window 4: the earliest possible is step 4); the
verifier fell from ~0.42 to 0.10-0.18 while the training reward rose from ~1.28 to ~1.55; final
accuracy 0.135 → 0.125 (lr_factor 0.01, twice) and 0.115 (lr_factor 0.1). 1:40 alone on an idle
2-core machine, 72 s of it the warm-start. The services run one OpenMP thread each (ServiceProc):
with one core kept busy (as the suite's other lane does) and torch's default of two threads, the
learner's update took 26.6 s a step instead of 0.53 s, and the test 6.5 min (the alarm at step 7
either way).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from brorl.apps.cluster.launcher import REPO_ROOT, child_env
from brorl.client import LearnerClient

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.redis]

MAX_STEPS_TO_ALARM = 8
HELDOUT = 200
TOLERANCE = 0.02  # 4 of the HELDOUT problems (measured: 2 flipped at lr_factor 0.01, 4 at 0.1)
WARMSTART = ["--steps", "1000", "--eval-problems", "200"]  # the demo recipe, shortened


def run_config(model, data) -> str:
    return f"""
model: {model}
data: {{train_path: {data}}}
reward_fn: "composite:math_answer=1,zero_pad=1"
sampling: {{n: 16, temperature: 1.0, top_k: -1, top_p: 1.0, max_tokens: 6}}
train: {{steps: 10, groups_per_step: 16, lr: 0.0003, kl_coef: 0.01, micro_batch_paths: 256}}
async: {{max_staleness: 1, publish_every: 1, max_inflight_groups: 16}}
checkpoint_every: 0  # rollbacks go to the step-0 checkpoint: the policy before the hack
# every version a full fp32 keyframe: the restored version is compared bit for bit below
weights: {{serving_dtype: fp32, keyframe_every: 1}}
monitors:
  action: rollback
  window: 4
  verifier_fn: exact_match
  verifier_sample: 1.0
  hacking_rise: 0.1
  hacking_drop: 0.1
  lr_factor: 0.01
  kl_factor: 10.0
  max_rollbacks: 2
"""


def warm_start(out: Path) -> Path:
    """The demo's warm-start (``python -m demo warmstart``, one thread), cached in ``out``."""
    proc = subprocess.run(
        [sys.executable, "-m", "demo", "--threads", "1", "warmstart", "--out", str(out), *WARMSTART]
        + ["--json"],
        cwd=REPO_ROOT,
        env=child_env(threads=1),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return Path(json.loads(proc.stdout.splitlines()[-1])["model"])


def module_weights(path):
    """A DeepSpeed checkpoint's module state dict (CPU tensors)."""
    import torch

    return torch.load(path / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)[
        "module"
    ]


def test_gamed_reward_trips_the_monitor_and_rolls_back(tmp_path, services):
    import torch
    from safetensors.torch import load_file

    from demo.evaluate import evaluate
    from demo.task import heldout_problems, problems

    model = warm_start(tmp_path / "warmstart")
    before = evaluate(model, held := heldout_problems(HELDOUT, max_digits=2)).accuracy
    data = tmp_path / "train.jsonl"
    exclude = {p.prompt for p in heldout_problems(1000, max_digits=2)}
    data.write_text(
        "".join(
            json.dumps({"prompt": p.prompt, "reference": p.answer}) + "\n"
            for p in problems(2000, seed=7, max_digits=2, exclude=exclude)
        )
    )

    namespace = f"hack-{uuid.uuid4().hex[:8]}"
    functions = {"zero_pad": {"type": "format", "pattern": "0[0-9]+"}}
    reward = services("reward", functions=json.dumps(functions))
    reward.wait_serving()
    rollout = services(
        "rollout",
        model=str(model),
        reward_address=reward.address,
        namespace=namespace,
        claim_idle_ms=5000,
    )
    learner = services(
        "learner",
        runs_dir=str(tmp_path / "runs"),
        namespace=namespace,
        read_roots=json.dumps([str(tmp_path)]),
        keep_weight_versions=100,
    )
    rollout.wait_serving()
    learner.wait_serving()
    client = LearnerClient(learner.address)
    run_id = f"hack-{uuid.uuid4().hex[:6]}"
    client.start(run_config(model, data), run_id=run_id)
    metrics = list(client.watch(run_id, timeout=900))
    final = client.get(run_id)
    assert final.state == "finished", final.message

    alarms = [m for m in metrics if m.event == "alarm"]
    rollbacks = [m for m in metrics if m.event == "rollback"]
    assert alarms and alarms[0].message.startswith("reward_hacking:"), [
        (m.step, m.event, m.message) for m in metrics if m.event
    ]
    assert alarms[0].step <= MAX_STEPS_TO_ALARM
    assert rollbacks and rollbacks[0].step == alarms[0].step

    # the restored weights: a new version above every one published before, equal to the
    # checkpoint's
    run_dir = tmp_path / "runs" / run_id
    ledger = json.loads((run_dir / "checkpoints" / "monitors.json").read_text())
    tag = rollbacks[0].message.split("rolled back to checkpoint ")[1].split()[0]
    assert ledger["checkpoints"][tag]["passed"]
    restored = int(rollbacks[0].values["learner/weight_version"])
    earlier = metrics[: metrics.index(rollbacks[0])]
    assert restored > max(m.values.get("learner/weight_version", 0) for m in earlier)
    published = load_file(run_dir / "weights" / f"v{restored:08d}" / "model.safetensors")
    saved = module_weights(run_dir / "checkpoints" / tag)
    assert published.keys() <= saved.keys()
    for name, tensor in published.items():
        assert torch.equal(tensor, saved[name]), name

    # groups sampled by the abandoned weights were dropped, not trained on: as stale when they
    # are more than max_staleness versions behind the restored one, else as rolled_back
    last = [m.values for m in metrics if "learner/loss" in m.values][-1]
    dropped = ("learner/dropped_groups/rolled_back", "learner/dropped_groups/stale")
    assert sum(last.get(k, 0) for k in dropped) > 0

    # the restored version answers exactly as the policy before the hack (the step-0 checkpoint)
    restored_dir = shutil.copytree(run_dir / "final", tmp_path / "restored")
    shutil.copy(run_dir / "weights" / f"v{restored:08d}" / "model.safetensors", restored_dir)
    assert evaluate(restored_dir, held).accuracy == before
    after = evaluate(run_dir / "final", held).accuracy
    print(f"held-out accuracy {before:.3f} -> {after:.3f}; alarm at step {alarms[0].step}")
    # Training goes on after the rollback, on the same gamed reward at 1/100 of the lr: the
    # weights drift by ~1e-5, which can flip a borderline greedy answer to the padded form.
    assert after >= before - TOLERANCE, (before, after)
