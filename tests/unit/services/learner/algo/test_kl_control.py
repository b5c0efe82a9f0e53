"""KL control (docs/algorithms.md "KL control"): the adaptive coefficient, the KL penalty in
the reward, and how the run config selects them; pure, against hand-worked numbers and twins."""

from __future__ import annotations

import pytest
import torch

from brorl.config.base import validate
from brorl.errors import InvalidArgument
from brorl.config.run import RunConfig
from brorl.config.train import TrainConfig
from kernels import clipped_policy_loss_reference, kl_estimate
from services.learner.algo.advantages import kl_penalised as kl_reward_advantages
from services.learner.algo.advantages import (
    kl_penalised_reference as kl_reward_advantages_reference,
)
from services.learner.algo.kl_control import KLController, adaptive_coef
from services.learner.algo.surrogate import surrogate_loss
from tests.unit.services.learner.algo.test_loss_options import grad_of, irregular, make_batch

ADAPTIVE = {"kind": "adaptive", "target": 0.1, "horizon": 128}


def test_adaptive_coef_by_hand():
    # kl 0.15 vs target 0.1: error +0.5 clipped to +0.2; 64 of 128 paths -> x 1.1
    assert adaptive_coef(0.1, 0.15, 0.1, 128, 64) == pytest.approx(0.11)
    # kl 0.09: error -0.1 -> x (1 - 0.05)
    assert adaptive_coef(0.1, 0.09, 0.1, 128, 64) == pytest.approx(0.095)
    # kl 0: error -1 clipped to -0.2; a whole horizon in one step -> x 0.8
    assert adaptive_coef(0.5, 0.0, 0.1, 100, 100) == pytest.approx(0.4)
    assert adaptive_coef(0.5, 0.1, 0.1, 100, 100) == pytest.approx(0.5)  # on target: unchanged


def test_fixed_control_never_moves_and_adaptive_follows_the_rule():
    fixed = KLController(TrainConfig(kl_coef=0.2))
    fixed.update(5.0, 1000)
    assert fixed.coef == 0.2 and not fixed.adaptive
    adaptive = KLController(TrainConfig(kl_coef=0.2, kl_control=ADAPTIVE))
    coef = 0.2
    for kl in (0.3, 0.3, 0.05, 0.11):
        adaptive.update(kl, 64)
        coef = adaptive_coef(coef, kl, 0.1, 128, 64)
        assert adaptive.coef == pytest.approx(coef)
    assert adaptive.coef != 0.2


def test_the_adaptive_coefficient_survives_a_checkpoint_and_a_fixed_one_keeps_the_config():
    train = TrainConfig(kl_coef=0.2, kl_control=ADAPTIVE)
    before = KLController(train)
    before.update(0.5, 128)
    after = KLController(train)
    after.restore(before.state())
    assert after.coef == before.coef == pytest.approx(0.24)
    fixed = KLController(TrainConfig(kl_coef=0.2))
    fixed.restore({"coef": 0.9})
    assert fixed.coef == 0.2
    after.restore(None)  # a checkpoint from before the key existed
    assert after.coef == pytest.approx(0.24)


def test_the_config_refuses_adaptive_control_without_a_starting_coefficient():
    with pytest.raises(InvalidArgument, match="kl_control adaptive needs kl_coef > 0"):
        validate(
            RunConfig,
            {"model": "m", "data": {"train_path": "x"}, "train": {"kl_control": ADAPTIVE}},
        )
    with pytest.raises(InvalidArgument, match="kl_in"):
        validate(RunConfig, {"model": "m", "data": {"train_path": "x"}, "train": {"kl_in": "x"}})
    train = TrainConfig()
    assert (train.kl_control.kind, train.kl_in, train.ratio_level) == ("fixed", "loss", "token")


# ---- the KL penalty in the reward ---------------------------------------------------------


def test_kl_reward_advantages_by_hand():
    adv = torch.tensor([1.0, -0.5])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, float("nan"), float("nan")]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    got = kl_reward_advantages(adv, kl, mask, coef=0.5, path_weight=torch.tensor([1.0, 0.5]))
    # row 0: 1 - 0.5 * (0.6, 0.5, 0.3); row 1: -0.5 - 0.5 * 0.5 * (0.4, 0, 0)
    assert got[0].tolist() == pytest.approx([0.7, 0.75, 0.85])
    assert got[1].tolist() == pytest.approx([-0.6, -0.5, -0.5])


def test_kl_reward_advantages_match_the_reference_on_irregular_paths():
    logp, _, adv, mask, ref = irregular(seed=13)
    kl = kl_estimate(logp, ref, "k1")
    w = torch.tensor([1.0, 0.5, 0.25, 1.0, 2.0])
    got = kl_reward_advantages(adv, kl, mask, 0.3, w)
    want = kl_reward_advantages_reference(adv.double(), kl.double(), mask, 0.3, w)
    assert got.tolist() == [pytest.approx(row, rel=1e-5, abs=1e-6) for row in want]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_in_reward_shapes_the_advantages_not_the_loss(estimator):
    logp, old, adv, mask, ref = irregular(seed=17)
    batch = make_batch(old, mask, adv)
    ref = torch.where(mask, ref, 0.0)  # the reference model's log-probs are finite everywhere
    cfg = TrainConfig(kl_coef=0.2, kl_in="reward", kl_estimator=estimator)
    loss, grad, stats = grad_of(
        lambda x: surrogate_loss(x, torch.zeros_like(x), batch, cfg, ref), logp
    )
    kl = kl_estimate(logp.double(), ref.double(), estimator)
    shaped = torch.tensor(kl_reward_advantages_reference(adv.double(), kl, mask, 0.2))
    clean_old = torch.where(mask, old, 0.0).double()  # the twin is not padding-proof
    r_loss, r_grad, _ = grad_of(
        lambda x: clipped_policy_loss_reference(x, clean_old, shaped, mask), logp.double()
    )
    torch.testing.assert_close(loss, r_loss.float(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grad, r_grad.float(), atol=1e-6, rtol=1e-5)
    assert stats["kl"] == pytest.approx(float(kl[mask].mean()), rel=1e-5)
    # in the loss instead: same measured KL, a different loss
    in_loss = TrainConfig(kl_coef=0.2, kl_in="loss", kl_estimator=estimator)
    l_loss, _, l_stats = grad_of(
        lambda x: surrogate_loss(x, torch.zeros_like(x), batch, in_loss, ref), logp
    )
    assert l_stats["kl"] == pytest.approx(stats["kl"], rel=1e-5)
    assert float(l_loss) != pytest.approx(float(loss), abs=1e-4)
