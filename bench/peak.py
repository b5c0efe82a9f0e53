"""The peak GEMM rate of this CPU, measured now: the denominator of every "achieved FLOP/s ÷
peak" figure, taken in the same run as the numerator because the machines are shared."""

from __future__ import annotations

import time


def peak_gemm_flops(threads: int | None = None, sizes=(1024,), repeats: int = 10) -> float:
    """Best fp32 FLOP/s of square (size × size) products over ``sizes`` and ``repeats`` tries
    (the machine is shared: the best is the least disturbed). ``threads``: torch's intra-op
    threads for the measurement (None: as they are)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    best = 0.0
    for size in sizes:
        a, b = torch.randn(size, size), torch.randn(size, size)
        a @ b  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            best = max(best, 2 * size**3 / (time.perf_counter() - start))
    return best
