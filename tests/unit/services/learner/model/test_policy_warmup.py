"""The learning-rate warm-up in the real Policy (DeepSpeed on CPU, a tiny Qwen2): the optimizer
runs each step at the ramp's rate, a rollback's lower base rate is ramped the same way, and a
run resumed from a checkpoint continues the ramp where it stopped."""

from __future__ import annotations

import pytest

from brorl.config.train import TrainConfig
from tests.unit.services.learner.model.test_policy_nonfinite import groups
from tests.unit.services.learner.tiny_model import tiny_qwen2

pytestmark = pytest.mark.slow
LR, WARMUP = 1e-3, 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    tiny_qwen2().save_pretrained(path)
    return str(path)


def optimizer_lrs(policy) -> list[float]:
    return [g["lr"] for g in policy.engine.optimizer.param_groups]


def test_each_step_runs_at_the_ramps_rate_and_a_resume_continues_it(model_dir, tmp_path):
    from services.learner.model.policy import Policy

    policy = Policy(model_dir, TrainConfig(lr=LR, lr_warmup_steps=WARMUP))
    logged = [policy.update(groups())["learner/lr"] for _ in range(2)]
    assert logged == pytest.approx([LR / 4, LR / 2], rel=1e-12)
    assert optimizer_lrs(policy) == pytest.approx([LR / 2] * len(optimizer_lrs(policy)))
    policy.save_checkpoint(str(tmp_path), "step2", {})
    policy.set_hyperparameters(lr=LR / 10, kl_coef=0.0)  # a rollback's lower base rate
    assert policy.update(groups())["learner/lr"] == pytest.approx(LR / 10 * 3 / 4)

    resumed = Policy(model_dir, TrainConfig(lr=LR, lr_warmup_steps=WARMUP))
    resumed.load_checkpoint(str(tmp_path), "step2")
    after = [resumed.update(groups())["learner/lr"] for _ in range(3)]
    assert after == pytest.approx([LR * 3 / 4, LR, LR], rel=1e-12)


def test_without_a_warmup_every_step_runs_at_lr(model_dir):
    from services.learner.model.policy import Policy

    policy = Policy(model_dir, TrainConfig(lr=LR))
    assert [policy.update(groups())["learner/lr"] for _ in range(2)] == [LR, LR]


def test_a_decay_reaches_its_floor_at_the_runs_last_optimizer_step(model_dir):
    from services.learner.model.policy import Policy

    linear = TrainConfig(lr=LR, steps=3, lr_decay="linear", lr_min_ratio=0.1)
    policy = Policy(model_dir, linear)
    logged = [policy.update(groups())["learner/lr"] for _ in range(4)]
    assert logged == pytest.approx([LR, LR * 0.55, LR * 0.1, LR * 0.1], rel=1e-12)

    # two optimizer steps an update: the run's 2 updates are 4 optimizer steps, the cosine's
    # factors 1, 0.75, 0.25, 0 (floor 0); learner/lr is each update's mean
    cosine = TrainConfig(lr=LR, steps=2, minibatches=2, lr_decay="cosine", lr_min_ratio=0.0)
    policy = Policy(model_dir, cosine)
    logged = [policy.update(groups())["learner/lr"] for _ in range(2)]
    assert logged == pytest.approx([LR * 0.875, LR * 0.125], rel=1e-9)
    assert policy.engine.global_steps == 4
