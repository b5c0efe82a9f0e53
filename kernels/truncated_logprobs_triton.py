"""Triton forward and backward of kernels.truncated_logprobs (the CUDA path).

The cut-offs of each row (kernels.cutoffs: the lowest kept (x, id), lo and v_lo) are found
in PyTorch, R rows at a time, as on CPU: a selection over the vocabulary (topk / sort) is what
PyTorch's CUDA kernels already do well. Then one program per (b, t) row streams the vocabulary
in BLOCK_V chunks, rebuilds the keep mask from those two numbers with comparisons, and runs the
online log-sum-exp + entropy of kernels.logprobs over the kept tokens (forward), or writes the
gradient of the kept tokens and zeros elsewhere (backward). Neither pass allocates anything of
size (R, V) or (B, T, V) except the gradient itself.

x = z / tau is computed with ``tl.math.div_rn`` (IEEE division, as PyTorch's): the keep
comparisons must see the very bits the cut-offs were found on.
"""

from __future__ import annotations

import torch
import triton.language as tl

import kernels.online_softmax as online_softmax
from kernels.dispatch import LazyKernel, next_power_of_2
from kernels.rows import chunk_cutoffs

_BLOCK_V = 4096


def _trunc_fwd_kernel(
    logits_ptr,
    ids_ptr,
    temp_ptr,
    lo_ptr,
    vlo_ptr,
    logp_ptr,
    ent_ptr,
    lse_ptr,
    T,
    V,
    stride_b,
    stride_t,
    BLOCK_V: tl.constexpr,
):
    # One program per (b, t) row; per-lane online max / sum / entropy (kernels.online_softmax).
    row = tl.program_id(0).to(tl.int64)
    b = row // T
    base = logits_ptr + b * stride_b + (row % T) * stride_t
    temp = tl.load(temp_ptr + b)
    lo = tl.load(lo_ptr + row)
    vlo = tl.load(vlo_ptr + row)
    idx = tl.load(ids_ptr + row)
    offs = tl.arange(0, BLOCK_V)
    m, s, t = online_softmax.start(BLOCK_V)
    for start in range(0, V, BLOCK_V):
        cols = start + offs
        valid = cols < V
        z = tl.load(base + cols, mask=valid, other=0.0).to(tl.float32)
        x = tl.math.div_rn(z, tl.zeros_like(z) + temp)
        keep = valid & ((x > lo) | ((x == lo) & (cols <= vlo)) | (cols == idx))
        m, s, t = online_softmax.update(m, s, t, tl.where(keep, x, float("-inf")))
    m_row, log_s, entropy = online_softmax.finish(m, s, t)
    z_id = tl.load(base + idx).to(tl.float32)
    x_id = tl.math.div_rn(z_id, temp)
    tl.store(logp_ptr + row, (x_id - m_row) - log_s)
    tl.store(ent_ptr + row, entropy)
    tl.store(lse_ptr + row, m_row + log_s)


def _trunc_bwd_kernel(
    logits_ptr,
    ids_ptr,
    temp_ptr,
    lo_ptr,
    vlo_ptr,
    lse_ptr,
    ent_ptr,
    glogp_ptr,
    gent_ptr,
    grad_ptr,
    T,
    V,
    stride_b,
    stride_t,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    b = row // T
    base = logits_ptr + b * stride_b + (row % T) * stride_t
    out = grad_ptr + row * V
    temp = tl.load(temp_ptr + b)
    lo = tl.load(lo_ptr + row)
    vlo = tl.load(vlo_ptr + row)
    lse = tl.load(lse_ptr + row)
    ent = tl.load(ent_ptr + row)
    gl = tl.load(glogp_ptr + row)
    gh = tl.load(gent_ptr + row)
    idx = tl.load(ids_ptr + row)
    offs = tl.arange(0, BLOCK_V)
    for start in range(0, V, BLOCK_V):
        cols = start + offs
        valid = cols < V
        z = tl.load(base + cols, mask=valid, other=0.0).to(tl.float32)
        x = tl.math.div_rn(z, tl.zeros_like(z) + temp)
        keep = (x > lo) | ((x == lo) & (cols <= vlo)) | (cols == idx)
        d = tl.where(keep, tl.maximum(x - lse, -1e30), -1e30)  # log p, finite
        p = tl.exp(d)  # 0 off the kept set
        g = -p * (gl + gh * (d + ent))
        g = tl.where(cols == idx, g + gl, g) / temp
        tl.store(out + cols, g.to(grad_ptr.dtype.element_ty), mask=valid)


_fwd_kernel = LazyKernel(_trunc_fwd_kernel)
_bwd_kernel = LazyKernel(_trunc_bwd_kernel)


def _launch_meta(V: int) -> tuple[int, int]:
    block = next_power_of_2(min(_BLOCK_V, V))
    return block, (8 if block >= 2048 else 4)


class _TritonTruncated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, ids_flat, temps, top_k, top_p, rows):
        B, T, V = logits.shape
        if logits.stride(-1) != 1:
            logits = logits.contiguous()
        temps = temps.float().contiguous()  # (B,)
        ids_flat = ids_flat.contiguous()  # (BT,)
        lo, v_lo = chunk_cutoffs(logits, temps, top_k, top_p, rows)
        logp = torch.empty(B * T, dtype=torch.float32, device=logits.device)
        ent, lse = torch.empty_like(logp), torch.empty_like(logp)
        block, warps = _launch_meta(V)
        if B * T > 0:
            _fwd_kernel[(B * T,)](
                logits,
                ids_flat,
                temps,
                lo,
                v_lo,
                logp,
                ent,
                lse,
                T,
                V,
                logits.stride(0),
                logits.stride(1),
                BLOCK_V=block,
                num_warps=warps,
            )
        ctx.save_for_backward(logits, ids_flat, temps, lo, v_lo, lse, ent)
        return logp.view(B, T), ent.view(B, T)

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        logits, ids_flat, temps, lo, v_lo, lse, ent = ctx.saved_tensors
        B, T, V = logits.shape
        grad = torch.empty((B, T, V), dtype=logits.dtype, device=logits.device)  # (B, T, V)
        g_logp = g_logp.float().reshape(-1).contiguous()  # (BT,)
        g_ent = g_ent.float().reshape(-1).contiguous()
        block, warps = _launch_meta(V)
        if B * T > 0:
            _bwd_kernel[(B * T,)](
                logits,
                ids_flat,
                temps,
                lo,
                v_lo,
                lse,
                ent,
                g_logp,
                g_ent,
                grad,
                T,
                V,
                logits.stride(0),
                logits.stride(1),
                BLOCK_V=block,
                num_warps=warps,
            )
        return grad, None, None, None, None, None


def triton_truncated_logprobs(logits, ids_flat, temps, top_k, top_p, rows):
    """kernels.truncated_logprobs_entropy on its Triton path (arguments already checked)."""
    return _TritonTruncated.apply(logits, ids_flat, temps, top_k, top_p, rows)
