"""Log-probs and entropy under each path's top-k / top-p truncated sampling distribution,
without (B, T, V) temporaries.

For logits z (B, T, V), sampled ids (B, T) and, per path b, a temperature tau_b, top_k_b and
top_p_b: x = z / tau_b, K = the tokens the cut-offs keep plus the sampled one (kernels.cutoffs
states the rule exactly), and

    lse      = log sum_{v in K} exp(x_v)                     # (B, T)
    logp     = x[id] - lse                                   # (B, T)
    entropy  = -sum_{v in K} p_v log p_v,  p_v = exp(x_v - lse)

    dL/dz_v  = 1[v in K] ( g_logp (1[v = id] - p_v) - g_ent p_v (log p_v + H) ) / tau_b

(the cut-offs are decisions, not functions with a gradient: tokens outside K get none, as with
the masked_fill of the naive path). Positions are processed in chunks of R rows: per chunk the
cut-offs are found (kernels.cutoffs.row_cutoffs) and summarised in two numbers per row; the
forward keeps those and the log-sum-exp, the backward rebuilds each chunk's keep mask from them
with comparisons only (no second sort). So the temporaries are (R, V), nothing of size (B, T, V)
is saved, and the only (B, T, V) allocation is the gradient in backward. A chunk whose cut-offs
keep few tokens (top-k 40: 40 a row) runs its exp / log-sum-exp on those only and saves their
ids (at most 1,024 a row), so its backward is a zero fill and N writes.

On CUDA (kernels.dispatch) the cut-offs are found the same way in PyTorch, chunk by chunk, and
the masked log-sum-exp / entropy forward and the backward run as Triton kernels
(kernels.truncated_logprobs_triton) that stream the vocabulary without any (R, V) temporary.
"""

from __future__ import annotations

import torch

from kernels.cutoffs import keep_mask, row_cutoffs, truncate_logits_reference
from kernels.dispatch import use_triton
from kernels.rows import acc_dtype as _acc_dtype
from kernels.rows import row_chunks, scaled_rows

_NEG_BIG = -1e30  # finite "minus infinity": log p of removed / -inf tokens, so 0 * log p = 0
# a chunk keeping at most min(_SPARSE_PER_ROW, _SPARSE_SHARE * V) tokens a row runs on them only
# and saves their ids: 8 KiB a row at most, and at most 1/8 of the fp32 logits' bytes
_SPARSE_PER_ROW, _SPARSE_SHARE = 1024, 1 / 16


# ----------------------------------------------------------------------------- reference


def truncated_logprobs_entropy_reference(
    logits: torch.Tensor,
    ids: torch.Tensor,
    temperature,
    top_k,
    top_p,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch twin (the test oracle): mask (B, T, V), full log_softmax, autograd.

    Float32, or float64 for float64 logits (the tests' oracle runs in float64).
    """
    temps, ks, ps = per_path(logits, temperature, top_k, top_p)
    scaled = logits.to(_acc_dtype(logits)) / temps[:, None, None]  # (B, T, V)
    logq = truncate_logits_reference(scaled, ks, ps, ids).log_softmax(-1)  # (B, T, V)
    logp = logq.gather(-1, ids.unsqueeze(-1)).squeeze(-1)  # (B, T)
    entropy = -(logq.exp() * logq).sum(-1)  # (B, T); removed tokens: 0 * (MASKED - lse) = 0
    return logp, entropy


# ----------------------------------------------------------------------------- helpers


def per_path(logits: torch.Tensor, temperature, top_k, top_p):
    """temperature, top_k, top_p as (B,) tensors on the logits' device (scalars broadcast).

    The temperature is cast to the accumulation dtype (exact for the learner's float32), top_p
    keeps its dtype: the cut compares it with the cumulative mass as the naive path did.
    """
    B = logits.shape[0]

    def one(value, dtype=None):
        t = torch.as_tensor(value, device=logits.device)
        t = t.to(dtype) if dtype is not None else t
        if t.dim() == 0:
            return t.expand(B)
        if t.shape != (B,):
            raise ValueError(f"per-path settings must be scalars or ({B},); got {tuple(t.shape)}")
        return t

    return one(temperature, _acc_dtype(logits)), one(top_k, torch.long), one(top_p)


def _sparse_cap(V: int) -> int:
    return min(_SPARSE_PER_ROW, int(V * _SPARSE_SHARE))


def _kept_ids(keep: torch.Tensor) -> torch.Tensor | None:
    """Flat ids r * V + v (N,) of a chunk's kept tokens if it keeps few, else None (dense).

    A cut-off usually keeps a small part of V (top-k 40: 40 tokens a row). Then the chunk runs
    on those N values only, and backward needs neither the keep mask nor x again: the ids are
    saved (at most _sparse_cap(V) a row: bounded by B*T, not by V). A wide nucleus keeps most
    of V, and runs densely on (R, V) instead, recomputing its mask in backward.
    """
    if int(torch.count_nonzero(keep)) > _sparse_cap(keep.shape[1]) * keep.shape[0]:
        return None
    return keep.view(-1).nonzero().squeeze(1)


def _kept_log_softmax(xv: torch.Tensor, r: torch.Tensor, R: int):
    """Per-row (lse (R,), entropy (R,)) and log p (N,) of kept values xv (N,) in rows r (N,)."""
    m = torch.full((R,), float("-inf"), dtype=xv.dtype, device=xv.device)
    m.scatter_reduce_(0, r, xv, "amax")  # (R,) row max (every row keeps its sampled id)
    d = xv - m[r]  # (N,) <= 0
    log_s = torch.zeros_like(m).index_add_(0, r, d.exp()).log_()  # (R,)
    logq = d.sub_(log_s[r])  # (N,)
    h = logq.exp().mul_(logq.clamp(min=_NEG_BIG))  # p log p; -inf logits: 0 * -1e30
    return m + log_s, -torch.zeros_like(m).index_add_(0, r, h), logq


def _dense_forward(x: torch.Tensor, keep: torch.Tensor):
    """(lse, entropy), each (R,), over the kept tokens of x (R, V), which is consumed."""
    z = x.masked_fill_(~keep, float("-inf"))  # (R, V)
    lse = z.logsumexp(-1)
    logq = z.sub_(lse[:, None])
    return lse, -logq.exp().mul_(logq.clamp_(min=_NEG_BIG)).sum(-1)


def _grad_x(logq, a, b, g_logp, at_id):
    """dL/dx on kept tokens: p (b log p - a) + g_logp 1[v = id], with a = g_logp + g_ent H and
    b = -g_ent (kernels.logprobs derives it). logq: log p, consumed; a, b, g_logp broadcast."""
    p = logq.exp()  # 0 off the kept set (exp(-inf) is cheaper than exp of a large negative)
    logq = logq.clamp_(min=_NEG_BIG)  # -inf -> finite, so that 0 * log p stays 0
    return p.mul_(logq.mul_(b).sub_(a)).add_(at_id * g_logp)


# ----------------------------------------------------------------------------- PyTorch path


class _ChunkedTruncated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, ids_flat, temps, top_k, top_p, rows):
        B, T, V = logits.shape
        acc = _acc_dtype(logits)
        logp = torch.empty(B * T, dtype=acc, device=logits.device)
        ent, lse, lo = torch.empty_like(logp), torch.empty_like(logp), torch.empty_like(logp)
        v_lo = torch.empty(B * T, dtype=torch.long, device=logits.device)
        # kept flat ids (global r * V + v) of the sparse chunks, in one buffer allocated up front:
        # small tensors kept alive between the chunks' large temporaries would fragment the heap
        # (measured: peak RSS several times higher). Pages never written are never resident.
        kept = torch.empty(B * T * _sparse_cap(V), dtype=torch.long, device=logits.device)
        ctx.chunks = []  # (r0, r1, None | (start, end) of the chunk's ids in `kept`)
        n_sparse = 0
        for r0, r1 in row_chunks(B * T, V, logits.device, rows):
            b = torch.arange(r0, r1, device=logits.device) // T  # (R,)
            x = scaled_rows(logits, temps, r0, r1)  # (R, V)
            ids = ids_flat[r0:r1]  # (R,)
            lo[r0:r1], v_lo[r0:r1] = cut = row_cutoffs(x, top_k[b], top_p[b])
            keep = keep_mask(x, *cut, ids)  # (R, V)
            x_id = x.gather(-1, ids[:, None]).squeeze(-1)  # (R,)
            flat = _kept_ids(keep)
            if flat is None:
                lse[r0:r1], ent[r0:r1] = _dense_forward(x, keep)
                ctx.chunks.append((r0, r1, None))
            else:
                lse[r0:r1], ent[r0:r1], _ = _kept_log_softmax(x.view(-1)[flat], flat // V, r1 - r0)
                kept[n_sparse : n_sparse + flat.numel()] = flat + r0 * V
                ctx.chunks.append((r0, r1, (n_sparse, n_sparse + flat.numel())))
                n_sparse += flat.numel()
            logp[r0:r1] = x_id - lse[r0:r1]
        ctx.save_for_backward(logits, ids_flat, temps, lo, v_lo, lse, ent, kept[:n_sparse])
        return logp.view(B, T), ent.view(B, T)

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        logits, ids_flat, temps, lo, v_lo, lse, ent, kept = ctx.saved_tensors
        B, T, V = logits.shape
        acc = lse.dtype
        g_logp = g_logp.reshape(-1).to(acc)  # (BT,)
        g_ent = g_ent.reshape(-1).to(acc)
        a, b = g_logp + g_ent * ent, -g_ent  # (BT,), see _grad_x
        grad = torch.empty((B, T, V), dtype=logits.dtype, device=logits.device)  # (B, T, V)
        grad_rows = grad.view(B * T, V)
        for r0, r1, span in ctx.chunks:
            out = grad_rows[r0:r1]  # (R, V)
            if span is not None:  # the saved kept ids: N values, no pass over V but a zero fill
                flat = kept[span[0] : span[1]]  # (N,) global r * V + v
                r, v = flat // V, flat % V
                xv = logits[r // T, r % T, v].to(acc) / temps[r // T]  # scaled_rows' bits
                at_id = v == ids_flat[r]
                g = _grad_x(xv.sub_(lse[r]), a[r], b[r], g_logp[r], at_id).div_(temps[r // T])
                out.zero_().view(-1)[flat - r0 * V] = g.to(out.dtype)
                continue
            x = scaled_rows(logits, temps, r0, r1)  # (R, V)
            ids = ids_flat[r0:r1]
            keep = keep_mask(x, lo[r0:r1], v_lo[r0:r1], ids)  # (R, V)
            c = slice(r0, r1)
            logq = x.sub_(lse[c, None]).masked_fill_(~keep, float("-inf"))  # (R, V) log p
            at_id = torch.zeros_like(keep).scatter_(-1, ids[:, None], True)
            g = _grad_x(logq, a[c, None], b[c, None], g_logp[c, None], at_id)  # 0 off the set
            rows_b = torch.arange(r0, r1, device=logits.device) // T
            out.copy_(g.div_(temps[rows_b][:, None]))
        return grad, None, None, None, None, None


# ----------------------------------------------------------------------------- public op


def truncated_logprobs_entropy(
    logits: torch.Tensor,
    ids: torch.Tensor,
    temperature,
    top_k,
    top_p,
    chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``ids`` and entropy, both (B, T), under each path's truncated distribution.

    logits (B, T, V) float, ids (B, T) long in [0, V). temperature (> 0), top_k (<= 0: off) and
    top_p (>= 1: off) are per path, (B,) tensors or scalars. Differentiable w.r.t. logits
    through both outputs. ``chunk_rows``: positions per chunk (None: about 8 MiB of fp32 per
    temporary on CPU). Triton on CUDA for float32/bf16/fp16 logits, PyTorch otherwise
    (kernels.dispatch). Results are float32 (float64 for float64 logits on the PyTorch path).
    """
    if logits.dim() != 3 or ids.shape != logits.shape[:2]:
        raise ValueError(
            f"want logits (B, T, V) and ids (B, T); got {tuple(logits.shape)}, {tuple(ids.shape)}"
        )
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    if chunk_rows is not None and chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    temps, ks, ps = per_path(logits, temperature, top_k, top_p)
    if not bool((temps > 0).all()):
        raise ValueError("temperatures must be > 0")
    if not bool((ps > 0).all()):
        raise ValueError("top_p must be > 0 (1: off)")
    ids_flat = ids.long().reshape(-1)  # (BT,)
    if logits.dtype != torch.float64 and use_triton(logits):
        from kernels.truncated_logprobs_triton import triton_truncated_logprobs

        return triton_truncated_logprobs(logits, ids_flat, temps, ks, ps, chunk_rows)
    return _ChunkedTruncated.apply(logits, ids_flat, temps, ks, ps, chunk_rows)
