"""Flattened rows of (B, T, V) logits, taken R rows at a time: the chunking, the temperature
scaling and the per-row top-k / top-p cut-offs that the truncated log-prob op (PyTorch path,
kernels/truncated_logprobs.py) and its Triton path (kernels/truncated_logprobs_triton.py) share.
"""

from __future__ import annotations

import torch

from kernels.cutoffs import row_cutoffs

# elements per (R, V) temporary: 8 MiB of fp32 on CPU (below glibc's mmap threshold, so chunk
# buffers are reused); more on a GPU, where fewer, larger chunks keep the device busy
_ROW_ELEMS = {"cpu": 1 << 21, "cuda": 1 << 24}


def acc_dtype(logits: torch.Tensor) -> torch.dtype:
    """The dtype log-probs are accumulated in: float32 at least."""
    return torch.promote_types(logits.dtype, torch.float32)


def row_chunks(n_rows: int, V: int, device: torch.device, rows: int | None):
    """[r0, r1) ranges of flattened (b, t) rows, each R rows (R * V elements per temporary)."""
    if rows is None:
        rows = max(1, _ROW_ELEMS.get(device.type, _ROW_ELEMS["cuda"]) // max(V, 1))
    for r0 in range(0, n_rows, rows):
        yield r0, min(r0 + rows, n_rows)


def scaled_rows(logits: torch.Tensor, temps: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
    """x = z / tau of flattened rows [r0, r1): a new (R, V) tensor in the accumulation dtype.

    Same elementwise division as the reference's (B, T, V) one, so the same bits. A strided
    view that cannot be flattened (logits[:, :-1]) gives up its rows by indexing: an (R, V) copy.
    """
    B, T, V = logits.shape
    rows = torch.arange(r0, r1, device=logits.device)  # (R,)
    try:
        z = logits.view(B * T, V)[r0:r1]  # (R, V) view
    except RuntimeError:
        z = logits[rows // T, rows % T]  # (R, V) copy
    return z.to(acc_dtype(logits)) / temps[rows // T][:, None]


def chunk_cutoffs(logits, temps, top_k, top_p, rows):
    """Per flattened row: (lo, v_lo) of kernels.cutoffs, found chunk by chunk. (BT,) each."""
    B, T, V = logits.shape
    lo = torch.empty(B * T, dtype=acc_dtype(logits), device=logits.device)
    v_lo = torch.empty(B * T, dtype=torch.long, device=logits.device)
    for r0, r1 in row_chunks(B * T, V, logits.device, rows):
        b = torch.arange(r0, r1, device=logits.device) // T
        x = scaled_rows(logits, temps, r0, r1)  # (R, V)
        lo[r0:r1], v_lo[r0:r1] = row_cutoffs(x, top_k[b], top_p[b])
    return lo, v_lo
