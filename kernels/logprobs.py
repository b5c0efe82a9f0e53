"""Token log-probs and entropy from logits without materialising the full log-softmax.

For logits z (B, T, V), chosen ids (B, T) and temperature tau, with x = z / tau:

    lse      = log sum_v exp(x_v)                      # (B, T)
    logp     = x[id] - lse                             # (B, T)
    entropy  = lse - sum_v p_v x_v,   p = softmax(x)   # (B, T)

Both paths stream over the vocabulary in chunks with an online log-sum-exp that also
carries sum_v exp(x_v - m) (x_v - m) relative to the running max m, so the entropy comes
out of the same pass. Backward recomputes p chunk by chunk from the saved lse:

    dL/dz_v = ( g_logp (1[v = id] - p_v) - g_ent p_v (log p_v + H) ) / tau

so nothing of size (B, T, V) is kept between forward and backward, and the only (B, T, V)
tensor that backward allocates is the gradient itself.

Contract: ids must lie in [0, V) (padded positions carry any valid id and are masked
downstream). Results are float32 (float64 for float64 logits on the PyTorch path); the
gradient has the logits' dtype. Logits may be a strided view with a contiguous last dim
(e.g. ``logits[:, :-1]``): neither path copies them.
"""

from __future__ import annotations

import torch
import triton.language as tl

import kernels.online_softmax as online_softmax
from kernels.dispatch import LazyKernel, next_power_of_2, use_triton
from kernels.rows import acc_dtype as _acc_dtype

_NEG_BIG = -1e30  # finite "minus infinity": keeps max/exp arithmetic free of inf - inf
_CPU_CHUNK_ELEMS = 1 << 21  # PyTorch path: rows x chunk elements per temporary (8 MiB fp32,
# below glibc's 32 MiB mmap ceiling, so chunk temporaries are reused instead of re-faulted)
_TRITON_BLOCK_V = 4096


# ----------------------------------------------------------------------------- reference


def token_logprobs_entropy_reference(
    logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch (the test oracle and the naive path): full log-softmax, autograd backward.

    Computes in float32, or float64 for float64 logits (the tests' oracle runs in float64).
    """
    logp_all = torch.log_softmax(logits.to(_acc_dtype(logits)) / temperature, dim=-1)  # (B, T, V)
    logp = logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)  # (B, T)
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # (B, T)
    return logp, entropy


# ----------------------------------------------------------------------------- PyTorch path


def _chunk_width(rows: int, V: int, chunk_size: int | None) -> int:
    if chunk_size is None:
        chunk_size = max(256, _CPU_CHUNK_ELEMS // max(rows, 1))
    return max(1, min(int(chunk_size), V))


def _chunk(logits: torch.Tensor, c0: int, c1: int, acc: torch.dtype) -> torch.Tensor:
    xc = logits[..., c0:c1]  # (B, T, C) view
    return xc if xc.dtype == acc else xc.to(acc)


def _shifted(xc: torch.Tensor, shift: torch.Tensor, temperature: float) -> torch.Tensor:
    """A new tensor x / tau - shift, with -inf lifted to a finite floor (so 0 * d stays 0)."""
    d = xc / temperature if temperature != 1.0 else xc
    d = d.sub_(shift.unsqueeze(-1)) if d is not xc else d - shift.unsqueeze(-1)
    return d.clamp_(min=_NEG_BIG)


class _ChunkedTorch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, ids, temperature, chunk):
        acc = _acc_dtype(logits)
        B, T, V = logits.shape
        m = torch.full((B, T), _NEG_BIG, dtype=acc, device=logits.device)  # running max
        s = torch.zeros((B, T), dtype=acc, device=logits.device)  # sum exp(x - m)
        t = torch.zeros((B, T), dtype=acc, device=logits.device)  # sum exp(x - m) (x - m)
        for c0 in range(0, V, chunk):
            xc = _chunk(logits, c0, min(c0 + chunk, V), acc)  # (B, T, C)
            m_c = xc.amax(-1)  # max(x / tau) == max(x) / tau exactly: division is monotone
            m_new = torch.maximum(m, m_c / temperature if temperature != 1.0 else m_c)
            d = _shifted(xc, m_new, temperature)  # x / tau - m_new, (B, T, C)
            e = d.exp()
            alpha = torch.exp(m - m_new)
            s_c = e.sum(-1)
            t = alpha * (t + s * (m - m_new)) + e.mul_(d).sum(-1)
            s = alpha * s + s_c
            m = m_new
        log_s = s.log()
        lse = m + log_s  # (B, T)
        entropy = log_s - t / s  # (B, T)
        x_id = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1).to(acc) / temperature
        logp = (x_id - m) - log_s  # (B, T)
        ctx.save_for_backward(logits, ids, lse, entropy)
        ctx.temperature, ctx.chunk = temperature, chunk
        return logp, entropy

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        logits, ids, lse, entropy = ctx.saved_tensors
        temperature, chunk = ctx.temperature, ctx.chunk
        acc = lse.dtype
        V = logits.shape[-1]
        g_logp, g_ent = g_logp.to(acc), g_ent.to(acc)  # (B, T)
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # (B, T, V)
        # dL/dx_v = -p_v (g_logp + g_ent (log p_v + H)) / tau  (+ g_logp / tau at v = id)
        #         =  p_v (b log p_v - a),  a = (g_logp + g_ent H) / tau,  b = -g_ent / tau
        a = ((g_logp + g_ent * entropy) / temperature).unsqueeze(-1)  # (B, T, 1)
        b = (-g_ent / temperature).unsqueeze(-1)
        g_id = g_logp / temperature  # (B, T)
        for c0 in range(0, V, chunk):
            c1 = min(c0 + chunk, V)
            d = _shifted(_chunk(logits, c0, c1, acc), lse, temperature)  # log p, (B, T, C)
            p = d.exp()
            g = d.mul_(b).sub_(a).mul_(p)
            local = ids - c0  # (B, T)
            inside = (local >= 0) & (local < c1 - c0)
            g.scatter_add_(
                -1, local.clamp(0, c1 - c0 - 1).unsqueeze(-1), (g_id * inside).unsqueeze(-1)
            )
            grad[..., c0:c1].copy_(g)
        return grad, None, None, None


# ----------------------------------------------------------------------------- Triton path


def _logprobs_fwd_kernel(
    logits_ptr,
    ids_ptr,
    logp_ptr,
    ent_ptr,
    lse_ptr,
    T,
    V,
    stride_b,
    stride_t,
    temperature,
    BLOCK_V: tl.constexpr,
):
    # One program per (b, t) row; per-lane online max / sum / entropy (kernels.online_softmax).
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + (row // T) * stride_b + (row % T) * stride_t
    offs = tl.arange(0, BLOCK_V)
    m, s, t = online_softmax.start(BLOCK_V)
    for start in range(0, V, BLOCK_V):
        cols = start + offs
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32) / temperature
        m, s, t = online_softmax.update(m, s, t, x)
    m_row, log_s, entropy = online_softmax.finish(m, s, t)
    idx = tl.load(ids_ptr + row)
    x_id = tl.load(base + idx).to(tl.float32) / temperature
    tl.store(logp_ptr + row, (x_id - m_row) - log_s)
    tl.store(ent_ptr + row, entropy)
    tl.store(lse_ptr + row, m_row + log_s)


def _logprobs_bwd_kernel(
    logits_ptr,
    ids_ptr,
    lse_ptr,
    ent_ptr,
    glogp_ptr,
    gent_ptr,
    grad_ptr,
    T,
    V,
    stride_b,
    stride_t,
    temperature,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + (row // T) * stride_b + (row % T) * stride_t
    out = grad_ptr + row * V
    lse = tl.load(lse_ptr + row)
    ent = tl.load(ent_ptr + row)
    gl = tl.load(glogp_ptr + row)
    gh = tl.load(gent_ptr + row)
    idx = tl.load(ids_ptr + row)
    offs = tl.arange(0, BLOCK_V)
    for start in range(0, V, BLOCK_V):
        cols = start + offs
        valid = cols < V
        x = tl.load(base + cols, mask=valid, other=float("-inf")).to(tl.float32) / temperature
        d = tl.maximum(x - lse, -1e30)  # log p, finite
        p = tl.exp(d)
        g = -p * (gl + gh * (d + ent))
        g = tl.where(cols == idx, g + gl, g) / temperature
        tl.store(out + cols, g.to(grad_ptr.dtype.element_ty), mask=valid)


_fwd_kernel = LazyKernel(_logprobs_fwd_kernel)
_bwd_kernel = LazyKernel(_logprobs_bwd_kernel)


def _triton_block(V: int, chunk_size: int | None) -> tuple[int, int]:
    block = next_power_of_2(min(chunk_size or _TRITON_BLOCK_V, V))
    return block, (8 if block >= 2048 else 4)


class _TritonLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, ids, temperature, chunk_size):
        B, T, V = logits.shape
        if logits.stride(-1) != 1:
            logits = logits.contiguous()
        ids_flat = ids.reshape(-1).contiguous()  # (B*T,)
        logp = torch.empty(B * T, dtype=torch.float32, device=logits.device)
        ent = torch.empty_like(logp)
        lse = torch.empty_like(logp)
        block, warps = _triton_block(V, chunk_size)
        if B * T > 0:
            _fwd_kernel[(B * T,)](
                logits,
                ids_flat,
                logp,
                ent,
                lse,
                T,
                V,
                logits.stride(0),
                logits.stride(1),
                float(temperature),
                BLOCK_V=block,
                num_warps=warps,
            )
        ctx.save_for_backward(logits, ids_flat, lse, ent)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return logp.view(B, T), ent.view(B, T)

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        logits, ids_flat, lse, ent = ctx.saved_tensors
        B, T, V = logits.shape
        grad = torch.empty((B, T, V), dtype=logits.dtype, device=logits.device)  # (B, T, V)
        g_logp = g_logp.float().reshape(-1).contiguous()  # (B*T,)
        g_ent = g_ent.float().reshape(-1).contiguous()
        block, warps = _triton_block(V, ctx.chunk_size)
        if B * T > 0:
            _bwd_kernel[(B * T,)](
                logits,
                ids_flat,
                lse,
                ent,
                g_logp,
                g_ent,
                grad,
                T,
                V,
                logits.stride(0),
                logits.stride(1),
                float(ctx.temperature),
                BLOCK_V=block,
                num_warps=warps,
            )
        return grad, None, None, None


# ----------------------------------------------------------------------------- public op


def token_logprobs_entropy(
    logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0, chunk_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``ids`` and entropy of softmax(logits / temperature), both (B, T).

    logits (B, T, V) float, ids (B, T) long. Differentiable w.r.t. logits through both
    outputs. ``chunk_size`` is the vocabulary chunk streamed at a time (Triton rounds it
    up to a power of two); None picks a default. Triton on CUDA, PyTorch elsewhere
    (see kernels.dispatch).
    """
    if logits.dim() != 3 or ids.shape != logits.shape[:2]:
        raise ValueError(
            f"want logits (B, T, V) and ids (B, T); got {tuple(logits.shape)}, {tuple(ids.shape)}"
        )
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    ids = ids.long()
    if use_triton(logits):
        return _TritonLogprobs.apply(logits, ids, float(temperature), chunk_size)
    B, T, V = logits.shape
    chunk = _chunk_width(B * T, V, chunk_size)
    return _ChunkedTorch.apply(logits, ids, float(temperature), chunk)
