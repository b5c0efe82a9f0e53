"""Fused clipped policy loss (PPO / GRPO / DAPO-style) with optional KL and truncated IS.

Per token, with A the advantage, w the (detached) truncated importance weight:

    ratio = exp(logp - old_logp)
    pg    = -min(ratio A, clip(ratio, 1 - eps_low, 1 + eps_high) A) * w
    kl    = k1: logp - ref          k2: (logp - ref)^2 / 2
            k3: exp(ref - logp) - 1 + (logp - ref)
    loss  = sum(mask * (pg + kl_coef kl)) / max(sum(mask), 1)          (token-level masked mean)

d loss / d logp per token = mask / den * ( -[ratio A <= clip(ratio) A] A ratio w + kl_coef dkl ),
with dkl = 1, (logp - ref), 1 - exp(ref - logp) for k1, k2, k3. This matches autograd of the
reference, including torch.min's tie rule (ties happen exactly when the ratio is inside the
clip range, where both branches carry the same gradient). Gradient reaches logp only.

Stats (detached 0-dim tensors, no host sync): clip_frac = masked share of tokens whose
clipped term is strictly smaller (their gradient is cut), ratio_mean, kl (0 without ref).
mask is 0/1 (bool or float). Masked tokens contribute nothing, even if non-finite.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.dispatch import LazyKernel, use_triton

_KL = {"k1": 1, "k2": 2, "k3": 3}
_BLOCK = 1024


# ----------------------------------------------------------------------------- reference


def kl_estimate(logp, ref_logp, kl_estimator="k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the sampled token's log-probs (B, T):
    k1 = logp - ref, k2 = (logp - ref)^2 / 2, k3 = exp(ref - logp) - 1 + (logp - ref)."""
    log_r = ref_logp - logp  # log(pi_ref / pi)
    if kl_estimator == "k1":
        return -log_r
    if kl_estimator == "k2":
        return 0.5 * log_r**2
    if kl_estimator == "k3":
        return torch.exp(log_r) - 1.0 - log_r
    raise ValueError(f"kl_estimator must be k1, k2 or k3, got {kl_estimator!r}")


def clipped_policy_loss_reference(
    logp,
    old_logp,
    advantages,
    mask,
    eps_low=0.2,
    eps_high=0.2,
    ref_logp=None,
    kl_coef=0.0,
    kl_estimator="k3",
    tis_weight=None,
) -> tuple[torch.Tensor, dict]:
    """Plain PyTorch with autograd (the test oracle)."""
    A = advantages.detach()
    A = A.unsqueeze(-1) if A.dim() == 1 else A  # (B, 1) or (B, T)
    ratio = torch.exp(logp - old_logp.detach())  # (B, T)
    s1 = ratio * A
    s2 = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * A
    pg = -torch.min(s1, s2)  # (B, T)
    if tis_weight is not None:
        pg = pg * tis_weight.detach()
    m = mask.to(logp.dtype)  # (B, T)
    den = m.sum().clamp(min=1.0)
    kl = torch.zeros_like(logp)
    if ref_logp is not None:
        kl = kl_estimate(logp, ref_logp.detach(), kl_estimator)
    loss = ((pg + kl_coef * kl) * m).sum() / den
    stats = {
        "clip_frac": (((s2 < s1).to(m.dtype) * m).sum() / den).detach(),
        "ratio_mean": ((ratio * m).sum() / den).detach(),
        "kl": ((kl * m).sum() / den).detach(),
    }
    return loss, stats


# ----------------------------------------------------------------------------- PyTorch path


def _token_terms(logp, old, A, ref, tis, lo, hi, kl_coef, est):
    """Per-token loss, d loss/d logp, ratio, clipped flag and KL; all (B, T)."""
    ratio = torch.exp(logp - old)
    s1 = ratio * A
    s2 = torch.clamp(ratio, lo, hi) * A
    w = tis if tis is not None else 1.0
    tok = -torch.minimum(s1, s2) * w
    dtok = torch.where(s1 <= s2, -A * ratio * w, 0.0)
    kl = torch.zeros_like(logp)
    if ref is not None:
        dl = logp - ref
        if est == 1:
            kl, dkl = dl, torch.ones_like(dl)
        elif est == 2:
            kl, dkl = 0.5 * dl * dl, dl
        else:
            e = torch.exp(-dl)
            kl, dkl = e - 1.0 + dl, 1.0 - e
        tok = tok + kl_coef * kl
        dtok = dtok + kl_coef * dkl
    return tok, dtok, ratio, s2 < s1, kl


class _PolicyLossTorch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, old, A, m, ref, tis, lo, hi, kl_coef, est):
        tok, _, ratio, clipped, kl = _token_terms(logp, old, A, ref, tis, lo, hi, kl_coef, est)
        valid = m != 0
        den = m.sum().clamp(min=1.0)

        def mmean(x):
            return torch.where(valid, x * m, 0.0).sum() / den

        ctx.save_for_backward(logp, old, A, m, ref, tis, den)
        ctx.args = (lo, hi, kl_coef, est)
        stats = (mmean(clipped.to(m.dtype)), mmean(ratio), mmean(kl))
        ctx.mark_non_differentiable(*stats)
        return (mmean(tok), *stats)

    @staticmethod
    def backward(ctx, g_loss, *_):
        logp, old, A, m, ref, tis, den = ctx.saved_tensors
        _, dtok, *_ = _token_terms(logp, old, A, ref, tis, *ctx.args)
        grad = torch.where(m != 0, dtok * m * (g_loss / den), 0.0)  # (B, T)
        return (grad.to(logp.dtype),) + (None,) * 9


# ----------------------------------------------------------------------------- Triton path


def _policy_loss_fwd_kernel(
    logp_ptr,
    old_ptr,
    adv_ptr,
    mask_ptr,
    ref_ptr,
    tis_ptr,
    part_ptr,
    N,
    T,
    lo,
    hi,
    kl_coef,
    ADV_PER_TOKEN: tl.constexpr,
    HAS_REF: tl.constexpr,
    HAS_TIS: tl.constexpr,
    KL_EST: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # Each program reduces BLOCK tokens to 5 partial sums: loss, mask, clipped, ratio, kl.
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < N
    m = tl.load(mask_ptr + offs, mask=inb, other=0.0)
    valid = m != 0.0
    lp = tl.load(logp_ptr + offs, mask=inb, other=0.0)
    ratio = tl.exp(lp - tl.load(old_ptr + offs, mask=inb, other=0.0))
    if ADV_PER_TOKEN:
        a = tl.load(adv_ptr + offs, mask=inb, other=0.0)
    else:
        a = tl.load(adv_ptr + offs // T, mask=inb, other=0.0)
    s1 = ratio * a
    s2 = tl.minimum(tl.maximum(ratio, lo), hi) * a
    tok = -tl.minimum(s1, s2)
    if HAS_TIS:
        tok = tok * tl.load(tis_ptr + offs, mask=inb, other=0.0)
    kl = tl.zeros([BLOCK], tl.float32)
    if HAS_REF:
        dl = lp - tl.load(ref_ptr + offs, mask=inb, other=0.0)
        if KL_EST == 1:
            kl = dl
        elif KL_EST == 2:
            kl = 0.5 * dl * dl
        else:
            kl = tl.exp(-dl) - 1.0 + dl
        tok = tok + kl_coef * kl
    out = part_ptr + pid * 5
    tl.store(out + 0, tl.sum(tl.where(valid, tok * m, 0.0), axis=0))
    tl.store(out + 1, tl.sum(m, axis=0))
    tl.store(out + 2, tl.sum(tl.where(valid & (s2 < s1), m, 0.0), axis=0))
    tl.store(out + 3, tl.sum(tl.where(valid, ratio * m, 0.0), axis=0))
    tl.store(out + 4, tl.sum(tl.where(valid, kl * m, 0.0), axis=0))


def _policy_loss_bwd_kernel(
    logp_ptr,
    old_ptr,
    adv_ptr,
    mask_ptr,
    ref_ptr,
    tis_ptr,
    scale_ptr,
    grad_ptr,
    N,
    T,
    lo,
    hi,
    kl_coef,
    ADV_PER_TOKEN: tl.constexpr,
    HAS_REF: tl.constexpr,
    HAS_TIS: tl.constexpr,
    KL_EST: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < N
    m = tl.load(mask_ptr + offs, mask=inb, other=0.0)
    lp = tl.load(logp_ptr + offs, mask=inb, other=0.0)
    ratio = tl.exp(lp - tl.load(old_ptr + offs, mask=inb, other=0.0))
    if ADV_PER_TOKEN:
        a = tl.load(adv_ptr + offs, mask=inb, other=0.0)
    else:
        a = tl.load(adv_ptr + offs // T, mask=inb, other=0.0)
    s1 = ratio * a
    s2 = tl.minimum(tl.maximum(ratio, lo), hi) * a
    g = tl.where(s1 <= s2, -a * ratio, 0.0)
    if HAS_TIS:
        g = g * tl.load(tis_ptr + offs, mask=inb, other=0.0)
    if HAS_REF:
        dl = lp - tl.load(ref_ptr + offs, mask=inb, other=0.0)
        if KL_EST == 1:
            g = g + kl_coef
        elif KL_EST == 2:
            g = g + kl_coef * dl
        else:
            g = g + kl_coef * (1.0 - tl.exp(-dl))
    scale = tl.load(scale_ptr)  # d out / d loss / den
    g = tl.where(m != 0.0, g * m * scale, 0.0)
    tl.store(grad_ptr + offs, g.to(grad_ptr.dtype.element_ty), mask=inb)


_fwd_kernel = LazyKernel(_policy_loss_fwd_kernel)
_bwd_kernel = LazyKernel(_policy_loss_bwd_kernel)


def _f32(x):
    return None if x is None else x.detach().float().contiguous()


class _PolicyLossTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, old, A, m, ref, tis, lo, hi, kl_coef, est):
        N, T = logp.numel(), logp.shape[-1]
        lp = logp.detach().contiguous()
        dummy = m  # stands in for absent ref / tis pointers (never read)
        meta = dict(
            ADV_PER_TOKEN=A.dim() == 2,
            HAS_REF=ref is not None,
            HAS_TIS=tis is not None,
            KL_EST=est,
            BLOCK=_BLOCK,
            num_warps=4,
        )
        nblocks = triton.cdiv(N, _BLOCK)
        part = torch.zeros((max(nblocks, 1), 5), dtype=torch.float32, device=logp.device)
        if N > 0:
            _fwd_kernel[(nblocks,)](
                lp,
                old,
                A,
                m,
                ref if ref is not None else dummy,
                tis if tis is not None else dummy,
                part,
                N,
                T,
                lo,
                hi,
                kl_coef,
                **meta,
            )
        sums = part.sum(0)  # (5,)
        den = sums[1].clamp(min=1.0)
        ctx.save_for_backward(lp, old, A, m, ref, tis, den)
        ctx.args = (N, T, lo, hi, kl_coef, meta)
        stats = (sums[2] / den, sums[3] / den, sums[4] / den)
        ctx.mark_non_differentiable(*stats)
        return (sums[0] / den, *stats)

    @staticmethod
    def backward(ctx, g_loss, *_):
        lp, old, A, m, ref, tis, den = ctx.saved_tensors
        N, T, lo, hi, kl_coef, meta = ctx.args
        scale = (g_loss.float() / den).reshape(1).contiguous()
        grad = torch.empty_like(lp)  # (B, T)
        if N > 0:
            _bwd_kernel[(triton.cdiv(N, _BLOCK),)](
                lp,
                old,
                A,
                m,
                ref if ref is not None else m,
                tis if tis is not None else m,
                scale,
                grad,
                N,
                T,
                lo,
                hi,
                kl_coef,
                **meta,
            )
        return (grad,) + (None,) * 9


# ----------------------------------------------------------------------------- public op


def clipped_policy_loss(
    logp,
    old_logp,
    advantages,
    mask,
    eps_low=0.2,
    eps_high=0.2,
    ref_logp=None,
    kl_coef=0.0,
    kl_estimator="k3",
    tis_weight=None,
) -> tuple[torch.Tensor, dict]:
    """Masked token-mean clipped surrogate (+ kl_coef * KL); see the module docstring.

    logp, old_logp, mask (B, T); advantages (B,) or (B, T); ref_logp, tis_weight (B, T) or None.
    Returns (loss 0-dim, stats {"clip_frac", "ratio_mean", "kl"} of detached 0-dim tensors).
    """
    if logp.dim() != 2:
        raise ValueError(f"want logp (B, T), got shape {tuple(logp.shape)}")
    for name, x in (
        ("old_logp", old_logp),
        ("mask", mask),
        ("ref_logp", ref_logp),
        ("tis_weight", tis_weight),
    ):
        if x is not None and x.shape != logp.shape:
            raise ValueError(
                f"{name} must have logp's shape {tuple(logp.shape)}, got {tuple(x.shape)}"
            )
    if advantages.shape not in (logp.shape, logp.shape[:1]):
        raise ValueError(
            f"advantages must be (B,) or (B, T) for logp {tuple(logp.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    if kl_estimator not in _KL:
        raise ValueError(f"kl_estimator must be one of {sorted(_KL)}, got {kl_estimator!r}")
    if not (0.0 <= eps_low < 1.0 and eps_high >= 0.0):
        raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got {eps_low}, {eps_high}")
    lo, hi, est = 1.0 - float(eps_low), 1.0 + float(eps_high), _KL[kl_estimator]
    if use_triton(logp):
        fn = _PolicyLossTriton
        args = (_f32(old_logp), _f32(advantages), _f32(mask), _f32(ref_logp), _f32(tis_weight))
    else:
        fn = _PolicyLossTorch
        acc = torch.promote_types(logp.dtype, torch.float32)
        args = tuple(
            None if x is None else x.detach().to(acc)
            for x in (old_logp, advantages, mask, ref_logp, tis_weight)
        )
        logp = logp if logp.dtype == acc else logp.to(acc)  # differentiable cast
        args = (args[0], args[1] if args[1].dim() == 2 else args[1].unsqueeze(-1), *args[2:])
    loss, clip_frac, ratio_mean, kl = fn.apply(logp, *args, lo, hi, float(kl_coef), est)
    return loss, {"clip_frac": clip_frac, "ratio_mean": ratio_mean, "kl": kl}
