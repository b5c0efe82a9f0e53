"""clipped_policy_loss (PyTorch path and Triton kernel) against its reference."""

import math

import pytest
import torch

from kernels import clipped_policy_loss, clipped_policy_loss_reference

TOL = dict(atol=1e-6, rtol=1e-5)


def _batch(B, T, seed=0, adv_per_token=False):
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(B, T, generator=g) * 0.5 - 2.0
    old = logp + torch.randn(B, T, generator=g) * 0.3  # ratios on both sides of the clip range
    old[:, ::5] = logp[:, ::5]  # ratio exactly 1: the min() tie
    ref = logp + torch.randn(B, T, generator=g) * 0.2
    adv = torch.randn((B, T) if adv_per_token else (B,), generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T) right padding
    tis = torch.rand(B, T, generator=g) * 2.0
    return logp, old, adv, mask, ref, tis


def _run(fn, logp, *args, **kw):
    x = logp.detach().clone().requires_grad_(True)
    loss, stats = fn(x, *args, **kw)
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), {k: float(v) for k, v in stats.items()}, grad


def test_reference_matches_scalar_math():
    logp, old, adv, mask, ref, tis = _batch(2, 6, seed=1)
    kw = dict(eps_low=0.1, eps_high=0.3, kl_coef=0.05, tis_weight=tis, ref_logp=ref)
    for est in ("k1", "k2", "k3"):
        loss, stats = clipped_policy_loss_reference(logp, old, adv, mask, kl_estimator=est, **kw)
        num = den = clip = ratio_sum = kl_sum = 0.0
        for b in range(2):
            for t in range(6):
                if not mask[b, t]:
                    continue
                r = math.exp(logp[b, t] - old[b, t])
                a = float(adv[b])
                unclipped, clipped = r * a, min(max(r, 0.9), 1.3) * a
                d = float(logp[b, t] - ref[b, t])
                kl = {"k1": d, "k2": 0.5 * d * d, "k3": math.exp(-d) - 1 + d}[est]
                num += -min(unclipped, clipped) * float(tis[b, t]) + 0.05 * kl
                den += 1
                clip += clipped < unclipped
                ratio_sum += r
                kl_sum += kl
        assert loss.item() == pytest.approx(num / den, abs=1e-6)
        assert float(stats["clip_frac"]) == pytest.approx(clip / den, abs=1e-6)
        assert float(stats["ratio_mean"]) == pytest.approx(ratio_sum / den, abs=1e-6)
        assert float(stats["kl"]) == pytest.approx(kl_sum / den, abs=1e-6)


@pytest.mark.parametrize("adv_per_token", [False, True])
@pytest.mark.parametrize("tis", [False, True])
@pytest.mark.parametrize("kl_estimator", [None, "k1", "k2", "k3"])
def test_matches_reference(backend, kl_estimator, tis, adv_per_token):
    logp, old, adv, mask, ref, w = _batch(3, 37, seed=7, adv_per_token=adv_per_token)
    kw = dict(
        eps_low=0.2, eps_high=0.28, tis_weight=w if tis else None
    )  # asymmetric (DAPO-style) clip
    if kl_estimator is not None:
        kw.update(ref_logp=ref, kl_coef=0.1, kl_estimator=kl_estimator)
    loss, stats, grad = _run(clipped_policy_loss, logp, old, adv, mask, **kw)
    r_loss, r_stats, r_grad = _run(
        clipped_policy_loss_reference,
        logp.double(),
        old.double(),
        adv.double(),
        mask,
        **{k: (v.double() if torch.is_tensor(v) else v) for k, v in kw.items()},
    )
    torch.testing.assert_close(loss, r_loss.float(), **TOL)
    torch.testing.assert_close(grad, r_grad.float(), **TOL)
    assert stats.keys() == {"clip_frac", "ratio_mean", "kl"}
    for k in stats:
        assert stats[k] == pytest.approx(r_stats[k], abs=1e-6), k
    assert 0 < stats["clip_frac"] < 1  # the case exercises both clipped and unclipped tokens
    assert (stats["kl"] == 0.0) == (kl_estimator is None)
    assert torch.all(grad[~mask] == 0)


def test_multi_block_token_count(backend):
    """More tokens than one Triton block (1024): partial sums across programs."""
    logp, old, adv, mask, ref, w = _batch(5, 517, seed=11)
    kw = dict(
        eps_low=0.15, eps_high=0.25, ref_logp=ref, kl_coef=0.2, kl_estimator="k3", tis_weight=w
    )
    loss, stats, grad = _run(clipped_policy_loss, logp, old, adv, mask, **kw)
    r_loss, r_stats, r_grad = _run(clipped_policy_loss_reference, logp, old, adv, mask, **kw)
    torch.testing.assert_close(loss, r_loss, **TOL)
    torch.testing.assert_close(grad, r_grad, **TOL)
    for k in stats:
        assert stats[k] == pytest.approx(r_stats[k], abs=1e-6), k


def test_float_mask_and_all_masked(backend):
    logp, old, adv, mask, ref, _ = _batch(2, 9, seed=3)
    loss, stats, grad = _run(
        clipped_policy_loss, logp, old, adv, mask.float(), ref_logp=ref, kl_coef=0.3
    )
    r_loss, _, r_grad = _run(
        clipped_policy_loss_reference, logp, old, adv, mask, ref_logp=ref, kl_coef=0.3
    )
    torch.testing.assert_close(loss, r_loss, **TOL)
    torch.testing.assert_close(grad, r_grad, **TOL)
    loss, stats, grad = _run(
        clipped_policy_loss, logp, old, adv, torch.zeros_like(mask), ref_logp=ref
    )
    assert loss.item() == 0.0 and torch.all(grad == 0) and stats["ratio_mean"] == 0.0


@pytest.mark.filterwarnings(
    "ignore:invalid value encountered:RuntimeWarning"
)  # the interpreter's numpy
def test_masked_garbage_does_not_leak(backend):
    """Padded positions may hold anything (inf, nan); they must not touch loss or grads."""
    logp, old, adv, mask, ref, _ = _batch(2, 13, seed=5)
    mask[1, 8:] = False
    dirty_old, dirty_ref = old.clone(), ref.clone()
    dirty_old[1, 8:] = float("-inf")
    dirty_ref[1, 8:] = float("nan")
    loss, stats, grad = _run(
        clipped_policy_loss, logp, dirty_old, adv, mask, ref_logp=dirty_ref, kl_coef=0.1
    )
    r_loss, r_stats, r_grad = _run(
        clipped_policy_loss_reference, logp, old, adv, mask, ref_logp=ref, kl_coef=0.1
    )
    torch.testing.assert_close(loss, r_loss, **TOL)
    torch.testing.assert_close(grad, r_grad, **TOL)
    assert stats["kl"] == pytest.approx(r_stats["kl"], abs=1e-6)


def test_gradient_reaches_logp_only(backend):
    logp, old, adv, mask, ref, w = _batch(2, 8, seed=9)
    leaves = [x.clone().requires_grad_(True) for x in (logp, old, adv, ref, w)]
    loss, stats = clipped_policy_loss(
        leaves[0], leaves[1], leaves[2], mask, ref_logp=leaves[3], kl_coef=0.1, tis_weight=leaves[4]
    )
    loss.backward()
    assert leaves[0].grad is not None and all(x.grad is None for x in leaves[1:])
    assert all(not v.requires_grad for v in stats.values())


@pytest.mark.parametrize(
    "kw",
    [dict(kl_estimator="k4"), dict(eps_low=1.0), dict(eps_high=-0.1)],
)
def test_rejects_bad_arguments(kw):
    logp, old, adv, mask, _, _ = _batch(2, 4)
    with pytest.raises(ValueError):
        clipped_policy_loss(logp, old, adv, mask, **kw)
    with pytest.raises(ValueError):
        clipped_policy_loss(logp, old, adv[:1], mask)
