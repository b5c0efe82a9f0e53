"""Sign compression with error feedback: the pure pieces of 1-bit Adam's momentum exchange
(Tang et al., 2021), and their float64 twins in plain Python (``*_reference``, the test oracle).

Layout. A flat vector of n elements is padded with zeros to N = R × S: R ranks, S the slice a
rank serves (a multiple of ``block``, itself a multiple of 8). Every block of ``block``
elements travels as its signs, packed 8 per byte (bit k of byte j: element 8j + k is >= 0, so a
zero counts as +), and one fp32 scale: the mean |x| over the block's real elements (the scale
that minimises the squared error of scale × sign(x)); padding never counts and is never kept.

The exchange (``exchange`` simulates it in one process; onebit_adam.py runs it over
torch.distributed):

1. worker i compresses x_i + e_i (its worker error), keeps e_i ← x_i + e_i − C(x_i + e_i), and
   sends slice j of C(x_i + e_i) to rank j (an all-to-all: one message per rank);
2. server j averages the R decompressed slices it got, compresses that plus its server error
   s_j, keeps s_j ← (mean + s_j) − C(mean + s_j), and sends C(mean + s_j) to every rank (an
   all-gather);
3. every rank decodes the R server slices: the same N values everywhere.

A message is a slice's packed signs, then its scales as bytes: S/8 + 4·S/block bytes.
Shapes: n elements, N = R × S padded, S a slice, K = ceil(n / block) blocks.
"""

from __future__ import annotations

import math

import numpy as np
import torch

_BIT = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)


def slice_size(n: int, world: int, block: int) -> int:
    """S: the elements a rank serves, a multiple of ``block``, with R × S >= n (at least one
    block, also for n = 0)."""
    if block <= 0 or block % 8:
        raise ValueError(f"block must be a positive multiple of 8, got {block}")
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    return max(1, math.ceil(n / (world * block))) * block


def pack_bits(positive: torch.Tensor) -> torch.Tensor:
    """(n,) bool → (ceil(n/8),) uint8, bit k of byte j = element 8j + k (numpy's packbits on
    the CPU; shifts elsewhere)."""
    if positive.device.type == "cpu":
        return torch.from_numpy(np.packbits(positive.numpy(), bitorder="little"))
    bits = positive.to(torch.uint8)
    pad = (-bits.numel()) % 8
    if pad:
        bits = torch.cat([bits, bits.new_zeros(pad)])
    bits = bits.view(-1, 8)  # (ceil(n/8), 8)
    out = bits[:, 0].clone()
    for k in range(1, 8):
        out |= bits[:, k] << k
    return out


def unpack_bits(packed: torch.Tensor, n: int) -> torch.Tensor:
    """(ceil(n/8),) uint8 → (n,) bool (the inverse of ``pack_bits``)."""
    if packed.device.type == "cpu":
        bits = np.unpackbits(packed.numpy(), count=n, bitorder="little")
        return torch.from_numpy(bits).view(torch.bool)
    bits = (packed.reshape(-1, 1) & _BIT.to(packed.device)) != 0  # (ceil(n/8), 8)
    return bits.reshape(-1)[:n]


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """(n,) → (ceil(n/8),) uint8: bit k of byte j set when x[8j + k] >= 0."""
    return pack_bits(x.reshape(-1) >= 0)


def unpack_signs(packed: torch.Tensor, n: int, dtype=torch.float32) -> torch.Tensor:
    """(ceil(n/8),) uint8 → (n,) of ±1 (the inverse of ``pack_signs``)."""
    return unpack_bits(packed, n).to(dtype) * 2 - 1


def block_scales(x: torch.Tensor, block: int, valid: int | None = None) -> torch.Tensor:
    """(n,) → (K,): the mean |x| of each block's first elements below ``valid`` (all n by
    default); a block with none is 0."""
    n = x.numel()
    valid = n if valid is None else max(0, min(valid, n))
    k = math.ceil(n / block)
    if valid == n == k * block:  # whole blocks, no padding: one pass
        return torch.linalg.vector_norm(x.view(k, block), ord=1, dim=1) / block
    magnitude = x.new_zeros(k * block)
    magnitude[:valid] = x[:valid].abs()
    starts = torch.arange(k, device=x.device) * block
    counts = (valid - starts).clamp(0, block).to(x.dtype)  # (K,)
    return magnitude.view(k, block).sum(dim=1) / counts.clamp(min=1)


def _signed(positive: torch.Tensor, scales: torch.Tensor, n: int, block: int) -> torch.Tensor:
    """(n,) bool and (K,) scales → (n,) +scale where positive, else −scale."""
    k = scales.numel()
    if n != k * block:
        positive = torch.cat([positive, positive.new_zeros(k * block - n)])
    signs = positive.to(scales.dtype).mul_(2).sub_(1)  # (K × block,) ±1: faster than where
    return signs.view(k, block).mul_(scales.view(k, 1)).view(-1)[:n]


def decompress(packed: torch.Tensor, scales: torch.Tensor, n: int, block: int) -> torch.Tensor:
    """(ceil(n/8),) signs and (K,) scales → (n,) scale × sign."""
    return _signed(unpack_bits(packed, n).to(scales.device), scales, n, block)


def compress(
    x: torch.Tensor, error: torch.Tensor, block: int, valid: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """C(x + error) as (packed signs, scales) and the new error (x + error) − C(x + error),
    zero at and beyond ``valid`` (padding). x, error: (n,); refuses NaN/inf (a NaN or inf makes
    its block's scale one, so the K scales are what is checked)."""
    y = x + error  # (n,)
    n = y.numel()
    scales = block_scales(y, block, valid)  # (K,)
    if not torch.isfinite(scales).all():
        bad = int((~torch.isfinite(y[:valid])).sum())
        raise ValueError(f"compress: {bad} of {n} values are NaN or inf; refusing them")
    positive = y >= 0  # (n,)
    packed = pack_bits(positive)
    new_error = y.sub_(_signed(positive, scales, n, block))  # y is ours: reused
    if valid is not None:
        new_error[max(valid, 0) :] = 0
    return packed, scales, new_error


def encode(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """A message: the packed signs, then the scales as fp32 bytes (uint8)."""
    return torch.cat([packed, scales.to(torch.float32).contiguous().view(torch.uint8)])


def decode(message: torch.Tensor, size: int, block: int) -> torch.Tensor:
    """A message of ``size`` elements → (size,) scale × sign, fp32."""
    nbits = size // 8
    scales = message[nbits:].clone().view(torch.float32)  # (size / block,), aligned copy
    return decompress(message[:nbits], scales, size, block)


def message_bytes(size: int, block: int) -> int:
    return size // 8 + 4 * (size // block)


def worker_messages(
    x: torch.Tensor, error: torch.Tensor, world: int, block: int, valid: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1 on one worker: x, error (N,) → ((R, message) uint8, row j for rank j; new error)."""
    size = x.numel() // world
    packed, scales, new_error = compress(x, error, block, valid)
    bits = packed.view(world, size // 8)  # (R, S/8)
    scale_rows = scales.view(world, size // block)  # (R, S/block)
    rows = [encode(bits[j], scale_rows[j]) for j in range(world)]
    return torch.stack(rows), new_error


def serve(
    messages: torch.Tensor, error: torch.Tensor, block: int, valid: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 2 on one server: (R, message) from the R workers for this slice, its error (S,)
    → (its message, new error); ``valid``: the slice's real elements."""
    size = error.numel()
    mean = decode(messages[0], size, block)  # (S,)
    for message in messages[1:]:
        mean += decode(message, size, block)
    mean /= len(messages)
    packed, scales, new_error = compress(mean.to(error.dtype), error, block, valid)
    return encode(packed, scales), new_error


def assemble(messages: torch.Tensor, size: int, block: int) -> torch.Tensor:
    """Step 3: the R servers' messages → (R × size,) fp32, the same on every rank."""
    return torch.cat([decode(m, size, block) for m in messages])


def slice_valid(n: int, rank: int, size: int) -> int:
    """The real elements in rank ``rank``'s slice of ``size``."""
    return max(0, min(size, n - rank * size))


def exchange(
    xs: list[torch.Tensor],
    worker_errors: torch.Tensor,
    server_errors: torch.Tensor,
    block: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The two-sided exchange of R ranks simulated in one process: xs, R tensors (n,);
    worker_errors (R, N); server_errors (R, S) → ((n,) estimate of the mean of xs, the new
    worker errors, the new server errors)."""
    world, n = len(xs), xs[0].numel()
    size = server_errors.shape[1]
    padded = [torch.cat([x.reshape(-1), x.new_zeros(world * size - n)]) for x in xs]
    sent, new_worker = zip(
        *(worker_messages(x, worker_errors[i], world, block, n) for i, x in enumerate(padded))
    )
    out, new_server = [], []
    for j in range(world):
        inbox = torch.stack([sent[i][j] for i in range(world)])  # (R, message)
        message, err = serve(inbox, server_errors[j], block, slice_valid(n, j, size))
        out.append(message)
        new_server.append(err)
    result = assemble(torch.stack(out), size, block)[:n].to(xs[0].dtype)
    return result, torch.stack(new_worker), torch.stack(new_server)


# ---- float64 twins in plain Python (test oracle) ------------------------------------------


def pack_signs_reference(values: list[float]) -> list[int]:
    out = []
    for j in range(0, len(values), 8):
        out.append(sum(1 << k for k, v in enumerate(values[j : j + 8]) if v >= 0))
    return out


def compress_reference(
    x: list[float], error: list[float], block: int, valid: int
) -> tuple[list[float], list[float]]:
    """(decompressed C(x + error), new error), element by element."""
    y = [a + b for a, b in zip(x, error)]
    if any(not math.isfinite(v) for v in y):
        raise ValueError("non-finite")
    out = []
    for start in range(0, len(y), block):
        real = [abs(v) for v in y[start : min(start + block, valid)]]
        scale = sum(real) / len(real) if real else 0.0
        out += [scale if v >= 0 else -scale for v in y[start : start + block]]
    new_error = [v - c if i < valid else 0.0 for i, (v, c) in enumerate(zip(y, out))]
    return out, new_error


def exchange_reference(
    xs: list[list[float]],
    worker_errors: list[list[float]],
    server_errors: list[list[float]],
    block: int,
) -> tuple[list[float], list[list[float]], list[list[float]]]:
    world, n, size = len(xs), len(xs[0]), len(server_errors[0])
    sent, new_worker = [], []
    for i in range(world):
        padded = list(xs[i]) + [0.0] * (world * size - n)
        c, e = compress_reference(padded, worker_errors[i], block, n)
        sent.append(c)
        new_worker.append(e)
    result, new_server = [], []
    for j in range(world):
        mean = [sum(sent[i][j * size + k] for i in range(world)) / world for k in range(size)]
        valid = max(0, min(size, n - j * size))
        c, e = compress_reference(mean, server_errors[j], block, valid)
        result += c
        new_server.append(e)
    return result[:n], new_worker, new_server
