"""Several learner ranks (services/learner/ranks.py): 2 gloo ranks give the weights 1 rank gives
after 3 updates, for every ZeRO stage; the 2-rank weights load into the rollout engine with
reload parity; a rank that dies ends the run with a message naming it, not a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
TOL = 1e-5
ROOT = Path(__file__).resolve().parents[2]


def harness(
    model, out, ranks=1, zero=0, die_at=0, timeout_s=240, estimator="grpo", extra=()
) -> subprocess.CompletedProcess:
    """ranks_harness in a process of its own; ``extra``: more of its flags."""
    cmd = [sys.executable, "-m", "tests.integration.ranks_harness", str(model), str(out)]
    cmd += ["--ranks", str(ranks), "--zero", str(zero), "--die-at", str(die_at)]
    cmd += ["--estimator", estimator, *extra]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)


def weights(directory):
    from safetensors.torch import load_file

    return load_file(str(Path(directory) / "model.safetensors"))


@pytest.mark.parametrize(
    "zero,estimator", [(0, "grpo"), (1, "grpo"), (2, "grpo"), (3, "grpo"), (3, "ppo")]
)
def test_two_ranks_give_the_weights_of_one(tiny_model_dir, tmp_path, zero, estimator):
    """Under ppo the critic's engine runs on the same ranks, and every rank draws the same
    mini-batch order: the policy's weights must still match one rank's."""
    for ranks in (1, 2):
        out = tmp_path / f"r{ranks}"
        done = harness(tiny_model_dir, out, ranks=ranks, zero=zero, estimator=estimator)
        assert done.returncode == 0, done.stderr[-3000:]
    a, b, start = weights(tmp_path / "r1"), weights(tmp_path / "r2"), weights(tiny_model_dir)
    moved = max((a[k] - start[k]).abs().max().item() for k in a)
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert moved > 1e-3, "the updates did not move the weights: the comparison means nothing"
    assert diff <= TOL, f"ZeRO-{zero}: 2 ranks differ from 1 by {diff}"


def test_the_two_rank_weights_reload_with_parity(tiny_model_dir, tiny_engine, tmp_path):
    from tests.integration.test_weight_reload_parity import (
        TOL as PARITY_TOL,
        greedy_report,
        load_hf,
        weights_only,
    )

    done = harness(tiny_model_dir, tmp_path / "r2", ranks=2, zero=2)
    assert done.returncode == 0, done.stderr[-3000:]
    hf = load_hf(tmp_path / "r2")  # config.json + the published safetensors
    start = tiny_engine.weight_version
    try:
        tiny_engine.load_weights(str(weights_only(tmp_path / "r2", tmp_path / "pub")), start + 1)
        _, diff, same = greedy_report(tiny_engine, hf, hf.config.eos_token_id)
        assert same and diff <= PARITY_TOL, diff
    finally:
        original = weights_only(Path(tiny_model_dir), tmp_path / "orig")
        tiny_engine.load_weights(str(original), start + 2)


def test_a_rank_that_dies_ends_the_run_with_a_message(tiny_model_dir, tmp_path):
    start = time.monotonic()
    done = harness(tiny_model_dir, tmp_path / "die", ranks=2, die_at=2)
    elapsed = time.monotonic() - start
    assert done.returncode == 3, done.stderr[-3000:]
    message = (tmp_path / "die" / "error.txt").read_text()
    assert message.startswith("learner rank 1 (pid ") and "exited with code -9" in message
    assert "restart the learner" in message
    assert elapsed < 120  # start-up included; the collective timeout alone is 20 s here
