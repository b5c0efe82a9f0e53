"""1-bit Adam (train.optimizer onebit_adam) inside 2 real learner ranks over gloo, through the rank
machinery and DeepSpeed (tests/integration/ranks_harness.py):

* its warm-up is AdamW: the same weights after 3 updates (max |Δw| <= 1e-6; measured 0.0);
* the compressed phase sends at most 1/20 of the fp32 all-reduce's bytes per rank and step
  (measured 1/28.4), and a run resumed from a checkpoint taken in the compressed phase continues
  compressed and gives the uninterrupted run's weights after 2 more updates (<= 1e-6);
* a rank killed in the compressed phase ends the run with a message naming it in < 60 s.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.ranks_harness import launch, max_diff, weights

pytestmark = pytest.mark.slow
ONEBIT = ["--optimizer", "onebit_adam"]


def test_the_warm_up_is_adamw_on_two_ranks(tiny_model_dir, harness_runs):
    adamw = weights(harness_runs.get(ranks=2))  # the 2-rank ZeRO-0 run the ranks test compares
    onebit = weights(harness_runs.get(ranks=2, extra=[*ONEBIT, "--freeze", "3"]))
    assert max_diff(adamw, weights(tiny_model_dir)) > 1e-3  # the updates moved the weights
    assert max_diff(adamw, onebit) <= 1e-6


def test_compressed_bytes_and_a_resume_in_the_compressed_phase(tiny_model_dir, tmp_path):
    """2 warm-up updates, then compressed ones; the checkpoint after update 3 is resumed."""
    steps = [*ONEBIT, "--freeze", "2", "--updates", "5"]
    full = launch(tiny_model_dir, tmp_path / "full", 2, extra=[*steps, "--checkpoint-at", "3"])
    assert full.returncode == 0, full.stderr[-3000:]
    ckpt = tmp_path / "full" / "ckpt"
    assert sorted(p.name for p in (ckpt / "update3").glob("onebit_adam_rank*.pt")) == [
        "onebit_adam_rank0.pt",
        "onebit_adam_rank1.pt",
    ]
    resumed = launch(tiny_model_dir, tmp_path / "resumed", 2, extra=[*steps, "--resume", ckpt])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert max_diff(weights(tmp_path / "full"), weights(tmp_path / "resumed")) <= 1e-6

    sent = json.loads((tmp_path / "full" / "comm.json").read_text())  # rank 0, per update
    totals = [sum(step.values()) for step in sent]
    n = sum(t.numel() for t in weights(tiny_model_dir).values())  # tied: the embedding once
    assert sent[0] == sent[1] == {"all_reduce": 4 * n}  # fp32 ring all-reduce, 2 ranks: 4n
    assert set(sent[2]) == {"all_reduce", "all_to_all", "all_gather"}
    assert totals[2] == totals[3] == totals[4] <= totals[0] / 20
    # the resumed run's two updates are compressed ones
    again = json.loads((tmp_path / "resumed" / "comm.json").read_text())
    assert again == sent[3:]


def test_a_killed_rank_ends_a_compressed_run_with_its_name(tiny_model_dir, tmp_path):
    start = time.monotonic()
    out = tmp_path / "die"
    done = launch(
        tiny_model_dir, out, ranks=2, die_at=3, extra=[*ONEBIT, "--freeze", "1", "--updates", "4"]
    )
    assert done.returncode == 3, done.stderr[-3000:]
    message = (out / "error.txt").read_text()
    assert message.startswith("learner rank 1 (pid ") and "exited with code -9" in message
    waited = (out / "error.txt").stat().st_mtime - float((out / "killed_at").read_text())
    assert waited < 60, waited  # the harness's collective timeout is 20 s
    assert time.monotonic() - start < 180
