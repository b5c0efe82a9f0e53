"""The loss options (docs/algorithms.md "Loss options"): token- vs sequence-level (GSPO)
importance ratios, clip-higher, truncated IS, against float64 twins and hand-worked numbers, on
the fused loss's PyTorch path and its Triton kernel (CPU interpreter)."""

from __future__ import annotations

import math

import pytest
import torch

from brorl.config.train import TrainConfig
from kernels import clipped_policy_loss, clipped_policy_loss_reference
from services.learner.model.batch import Batch
from services.learner.algo.importance import (
    ratio_baseline,
    sequence_log_ratio,
    sequence_policy_loss_reference,
    tis_weight,
    tis_weight_reference,
)
from services.learner.algo.surrogate import surrogate_loss
from tests.unit.kernels.conftest import backend, launches  # noqa: F401  (fixtures)

TOL = dict(atol=1e-6, rtol=1e-5)


def irregular(seed=0, B=5, T=11):
    """Paths of lengths T, 1, 4, 0 (no tokens) and 7, with inf/nan on the padding."""
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(B, T, generator=g) * 0.5 - 2.0
    old = logp + torch.randn(B, T, generator=g) * 0.25
    ref = logp + torch.randn(B, T, generator=g) * 0.2
    adv = torch.randn(B, generator=g)
    lengths = torch.tensor([T, 1, 4, 0, 7])[:B]
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    old = torch.where(mask, old, torch.tensor(float("-inf")))
    ref = torch.where(mask, ref, torch.tensor(float("nan")))
    return logp, old, adv, mask, ref


def grad_of(fn, logp):
    x = logp.detach().clone().requires_grad_(True)
    out = fn(x)
    loss = out[0] if isinstance(out, tuple) else out
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad, out[1] if isinstance(out, tuple) else None


def make_batch(sampling_logp, mask, advantages, weight=None) -> Batch:
    B, T = sampling_logp.shape
    return Batch(
        prompt_ids=torch.tensor([1]),
        targets=torch.zeros(B, T, dtype=torch.long),
        loss_mask=mask.float(),
        sampling_logp=sampling_logp,
        advantages=advantages,
        temperature=torch.ones(B),
        top_k=torch.full((B,), -1),
        top_p=torch.ones(B),
        version=torch.zeros(B, dtype=torch.long),
        weight=torch.ones(B) if weight is None else weight,
        path_index=torch.arange(B),
        group_index=0,
    )


# ---- sequence-level ratio (GSPO) ------------------------------------------------------------


def test_sequence_ratio_by_hand(backend):  # noqa: F811
    # one path of 2 tokens, log-ratios 0.05 and 0.25, padding nan; A = 1, clip 0.2 / 0.2
    logp = torch.tensor([[0.0, 0.0, 0.0]])
    old = torch.tensor([[-0.05, -0.25, float("nan")]])
    mask = torch.tensor([[True, True, False]])
    adv = torch.tensor([1.0])
    assert float(sequence_log_ratio(logp, old, mask)[0]) == pytest.approx(0.15)

    def loss_at(level):
        base = ratio_baseline(logp, old, mask, level)
        return grad_of(lambda x: clipped_policy_loss(x, base, adv, mask), logp)

    # sequence: s = e^0.15 = 1.1618 inside the clip: loss -s, d/dlogp_t = -s / 2 on each token
    loss, grad, stats = loss_at("sequence")
    s = math.exp(0.15)
    assert float(loss) == pytest.approx(-s, abs=1e-6)
    assert grad[0].tolist() == pytest.approx([-s / 2, -s / 2, 0.0], abs=1e-6)
    assert float(stats["clip_frac"]) == 0.0 and float(stats["ratio_mean"]) == pytest.approx(s)
    # token: e^0.05 = 1.0513 inside, e^0.25 = 1.2840 clipped to 1.2 (no gradient)
    loss, grad, stats = loss_at("token")
    assert float(loss) == pytest.approx(-(math.exp(0.05) + 1.2) / 2, abs=1e-6)
    assert grad[0].tolist() == pytest.approx([-math.exp(0.05) / 2, 0.0, 0.0], abs=1e-6)
    assert float(stats["clip_frac"]) == 0.5


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("kl", [None, "k1", "k3"])
def test_sequence_ratio_matches_the_gspo_reference(backend, kl):  # noqa: F811
    logp, old, adv, mask, ref = irregular(seed=3)
    kw = dict(eps_low=0.05, eps_high=0.08)  # tight: some paths clipped, some not
    if kl:
        kw.update(ref_logp=ref, kl_coef=0.1, kl_estimator=kl)
    base = ratio_baseline(logp, old, mask, "sequence")
    loss, grad, stats = grad_of(lambda x: clipped_policy_loss(x, base, adv, mask, **kw), logp)
    kw64 = {k: v.double() if torch.is_tensor(v) else v for k, v in kw.items()}
    r_loss, r_grad, _ = grad_of(
        lambda x: sequence_policy_loss_reference(x, old.double(), adv.double(), mask, **kw64),
        logp.double(),
    )
    torch.testing.assert_close(loss, r_loss.float(), **TOL)
    torch.testing.assert_close(grad, r_grad.float(), **TOL)
    assert 0 < float(stats["clip_frac"]) < 1  # both clipped and unclipped paths
    assert torch.all(grad[~mask] == 0)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_sequence_tis_weights_match_the_gspo_reference(backend):  # noqa: F811
    logp, old, adv, mask, _ = irregular(seed=5)
    sampling = torch.where(mask, logp + torch.linspace(-1.5, 1.5, 11), float("-inf"))
    w = tis_weight(logp, sampling, mask, cap=1.5, level="sequence")  # (B, T)
    loss, grad, _ = grad_of(
        lambda x: clipped_policy_loss(x, x.detach(), adv, mask, tis_weight=w), logp
    )
    per_path = w.max(-1).values.double()  # one weight per path
    r_loss, r_grad, _ = grad_of(
        lambda x: sequence_policy_loss_reference(
            x, x.detach(), adv.double(), mask, path_weight=per_path
        ),
        logp.double(),
    )
    torch.testing.assert_close(loss, r_loss.float(), **TOL)
    torch.testing.assert_close(grad, r_grad.float(), **TOL)


def test_token_level_is_the_plain_ppo_ratio():
    logp, old, adv, mask, _ = irregular(seed=1)
    assert torch.equal(ratio_baseline(logp, old, mask, "token"), old)
    with pytest.raises(ValueError, match="ratio_level"):
        ratio_baseline(logp, old, mask, "path")


# ---- truncated IS -----------------------------------------------------------------------------


def test_tis_weights_by_hand():
    logp = torch.zeros(1, 3)
    sampling = torch.tensor([[-math.log(3.0), math.log(2.0), float("nan")]])  # ratios 3, 0.5
    mask = torch.tensor([[True, True, False]])
    assert tis_weight(logp, sampling, mask, 2.0, "token")[0].tolist() == pytest.approx(
        [2.0, 0.5, 0.0]
    )
    seq = math.sqrt(1.5)  # geometric mean of 3 and 0.5
    assert tis_weight(logp, sampling, mask, 2.0, "sequence")[0].tolist() == pytest.approx(
        [seq, seq, 0.0]
    )


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_tis_weights_match_the_reference_on_irregular_paths(level):
    logp, old, _, mask, _ = irregular(seed=7)
    sampling = old - 0.6 * torch.arange(11.0)  # some ratios far above the cap
    got = tis_weight(logp, sampling, mask, 1.7, level)
    want = tis_weight_reference(logp.double(), sampling.double(), mask, 1.7, level)
    assert got.tolist() == [pytest.approx(row, rel=1e-6) for row in want]
    assert (got[mask] == 1.7).any() and (got[mask] < 1.7).any()
    assert not got.requires_grad


# ---- the options from the run config (losses.surrogate_loss) ----------------------------------


def config_loss(logp, sampling, mask, adv, **train):
    batch = make_batch(sampling, mask, adv)
    cfg = TrainConfig(**train)
    return grad_of(lambda x: surrogate_loss(x, torch.zeros_like(x), batch, cfg), logp)


def test_clip_higher_widens_only_the_upper_bound(backend):  # noqa: F811
    # token 0: ratio 1.25 with A = +1; token 1: ratio 0.75 with A = -1 (two paths of one token)
    logp = torch.zeros(2, 1)
    sampling = torch.log(torch.tensor([[1 / 1.25], [1 / 0.75]]))
    mask = torch.ones(2, 1, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0])

    def terms(**clip):
        loss, grad, stats = config_loss(logp, sampling, mask, adv, **clip)
        return float(loss) * 2, grad[:, 0].tolist(), stats["clip_frac"]

    # symmetric 0.2: 1.25 clipped to 1.2; 0.75 clipped to 0.8 (-min(-0.75, -0.8) = 0.8)
    assert terms(clip_low=0.2, clip_high=0.2) == (pytest.approx(-1.2 + 0.8), [0.0, 0.0], 1.0)
    # clip-higher 0.28: 1.25 now inside (its gradient flows); the lower side is unchanged
    loss, grad, frac = terms(clip_low=0.2, clip_high=0.28)
    assert (loss, frac) == (pytest.approx(-1.25 + 0.8), 0.5)
    assert grad == pytest.approx([-1.25 / 2, 0.0])
    # the lower bound is clip_low's alone: 0.3 lets 0.75 through
    loss, grad, frac = terms(clip_low=0.3, clip_high=0.2)
    assert (loss, frac) == (pytest.approx(-1.2 + 0.75), 0.5)
    assert grad == pytest.approx([0.0, 0.75 / 2])


def test_tis_option_weights_the_on_policy_loss(backend):  # noqa: F811
    logp, old, adv, mask, _ = irregular(seed=9)
    sampling = torch.where(mask, logp - 0.3 * torch.arange(11.0) + 0.5, float("-inf"))
    loss, grad, stats = config_loss(logp, sampling, mask, adv, off_policy="tis", tis_cap=2.0)
    w = torch.tensor(tis_weight_reference(logp.double(), sampling.double(), mask, 2.0, "token"))
    r_loss, r_grad, _ = grad_of(
        lambda x: clipped_policy_loss_reference(x, x.detach(), adv.double(), mask, tis_weight=w),
        logp.double(),
    )
    torch.testing.assert_close(loss, r_loss.float(), **TOL)
    torch.testing.assert_close(grad, r_grad.float(), **TOL)
    raw = torch.exp(logp - sampling)[mask]
    assert stats["tis_weight_mean"] == pytest.approx(float(w[mask].mean()), rel=1e-5)
    assert stats["tis_capped_frac"] == pytest.approx(float((raw > 2.0).float().mean()))
    assert 0 < stats["tis_capped_frac"] < 1


def test_sequence_option_reaches_the_loss():
    logp, old, adv, mask, _ = irregular(seed=11)
    seq, _, _ = config_loss(logp, old, mask, adv, ratio_level="sequence", clip_low=0.05)
    tok, _, _ = config_loss(logp, old, mask, adv, ratio_level="token", clip_low=0.05)
    want = sequence_policy_loss_reference(logp.double(), old.double(), adv.double(), mask, 0.05)
    assert float(seq) == pytest.approx(float(want), abs=1e-6)
    assert float(tok) != pytest.approx(float(seq), abs=1e-4)
