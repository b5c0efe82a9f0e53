"""Several learner ranks (services/learner/ranks.py): 2 gloo ranks give the weights 1 rank gives
after 3 updates, for every ZeRO stage; the 2-rank weights load into the rollout engine with
reload parity; a rank that dies ends the run with a message naming it, not a hang."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.ranks_harness import launch, max_diff, weights

pytestmark = pytest.mark.slow
TOL = 1e-5


@pytest.mark.parametrize(
    "zero,estimator", [(0, "grpo"), (1, "grpo"), (2, "grpo"), (3, "grpo"), (3, "ppo")]
)
def test_two_ranks_give_the_weights_of_one(tiny_model_dir, harness_runs, zero, estimator):
    """The reference is one rank at ZeRO-0 for stages 0-2 (one rank's weights are the same at
    stages 0, 1 and 2: max |Δw| 0.0, measured), so a stage that broke one rank as well as two
    is caught too; for stage 2 with a prompt pass per chunk, as ZeRO-2 runs it
    (services/learner/model/prompt_once.py: a prompt shared by a group's chunks sums its
    gradient in another order, 1.4e-5 after 3 updates, over TOL). At ZeRO-3, one rank at ZeRO-3
    (its partitioned parameters sum in another order: 1.8e-5 from one rank at ZeRO-0). Under ppo
    the critic's engine runs on the same ranks, and every rank draws the same mini-batch order:
    the policy's weights must still match one rank's."""
    extra = ["--prompt-per-chunk"] if zero == 2 else []
    one_zero = 3 if zero == 3 else 0
    one = weights(harness_runs.get(ranks=1, zero=one_zero, estimator=estimator, extra=extra))
    two = weights(harness_runs.get(ranks=2, zero=zero, estimator=estimator))
    start = weights(tiny_model_dir)
    moved, diff = max_diff(one, start), max_diff(one, two)
    assert moved > 1e-3, "the updates did not move the weights: the comparison means nothing"
    assert diff <= TOL, f"ZeRO-{zero}: 2 ranks differ from 1 by {diff}"


def test_the_two_rank_weights_reload_with_parity(
    tiny_model_dir, tiny_engine, harness_runs, tmp_path
):
    from tests.integration.test_weight_reload_parity import (
        TOL as PARITY_TOL,
        greedy_report,
        load_hf,
        weights_only,
    )

    two = harness_runs.get(ranks=2, zero=2)
    hf = load_hf(two)  # config.json + the published safetensors
    start = tiny_engine.weight_version
    try:
        tiny_engine.load_weights(str(weights_only(two, tmp_path / "pub")), start + 1)
        _, diff, same = greedy_report(tiny_engine, hf, hf.config.eos_token_id)
        assert same and diff <= PARITY_TOL, diff
    finally:
        original = weights_only(Path(tiny_model_dir), tmp_path / "orig")
        tiny_engine.load_weights(str(original), start + 2)


def test_a_rank_that_dies_ends_the_run_with_a_message(tiny_model_dir, tmp_path):
    start = time.monotonic()
    done = launch(tiny_model_dir, tmp_path / "die", ranks=2, die_at=2)
    elapsed = time.monotonic() - start
    assert done.returncode == 3, done.stderr[-3000:]
    message = (tmp_path / "die" / "error.txt").read_text()
    assert message.startswith("learner rank 1 (pid ") and "exited with code -9" in message
    assert "restart the learner" in message
    assert elapsed < 120  # start-up included; the collective timeout alone is 20 s here
