"""Shared helpers of the kernel benchmarks: timing with triton.testing, peak memory, tables.

Each bench module defines ``cases(quick)``, ``make_inputs(case, device)``,
``providers(inputs, mode)`` (name -> zero-argument callable) and ``bytes_moved(case, mode)``;
:func:`run` times every provider on every case and prints one row each.

Bandwidth is *effective*: the bytes the op must move at minimum (read inputs once, write
outputs once; ``bytes_moved``) divided by the measured time, the same numerator for every
provider, so it compares providers and shows how close each gets to the HBM peak
(H200: ~4.8 TB/s). The table goes to stderr; stdout carries one JSON object (``KEYS``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
from typing import Any, Callable, Iterator

import torch

MIB = 1 << 20
# the printed object's documented keys (tests/unit/bench/test_bench_smoke.py checks them)
KEYS = ("bench", "device", "rows")


@contextlib.contextmanager
def env(**values: str) -> Iterator[None]:
    """Set environment variables for the duration of a call (e.g. BRORL_TRITON=0)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def with_env(fn: Callable[[], Any], **values: str) -> Callable[[], Any]:
    def call() -> Any:
        with env(**values):
            return fn()

    return call


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """torch.compile(fn) (static shapes), built and compiled at the first call."""
    cache: list[Callable[..., Any]] = []

    def call(*args: Any, **kwargs: Any) -> Any:
        if not cache:
            cache.append(torch.compile(fn, dynamic=False))
        return cache[0](*args, **kwargs)

    return call


def time_ms(
    fn: Callable[[], Any], grad_to_none: list[torch.Tensor] | None = None
) -> tuple[float, float, float]:
    """(median, p20, p80) milliseconds from triton.testing.do_bench (CUDA only)."""
    import triton.testing

    med, lo, hi = triton.testing.do_bench(
        fn, warmup=25, rep=100, grad_to_none=grad_to_none, quantiles=[0.5, 0.2, 0.8]
    )
    return med, lo, hi


def peak_extra_mib(fn: Callable[[], Any], reset: Callable[[], None] | None = None) -> float:
    """Peak CUDA memory one call allocates beyond what was allocated before it."""
    if reset:
        reset()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out
    if reset:
        reset()
    return (peak - base) / MIB


def parse_args(description: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true", help="a few small cases only")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile provider")
    ap.add_argument("--json", metavar="PATH", help="also write all rows to this JSON file")
    return ap.parse_args()


def run(title: str, module: Any, args: argparse.Namespace) -> list[dict]:
    """Time and measure every provider of `module` on every case; print a table (stderr) and
    one JSON object of all rows (stdout)."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{title}: needs a CUDA device (these benchmarks time GPU kernels)")
    rows: list[dict] = []
    device = torch.cuda.get_device_name()
    table = functools.partial(print, file=sys.stderr, flush=True)
    table(f"\n== {title} on {device} ==")
    table(f"{'case':<44} {'mode':<8} {'provider':<14} {'ms':>9} {'GB/s':>8} {'peak MiB':>10}")
    for case in module.cases(args.quick):
        inputs = module.make_inputs(case, "cuda")
        for mode in module.MODES:
            nbytes = module.bytes_moved(case, mode)
            for name, fn in module.providers(inputs, mode).items():
                if name == "compile" and args.no_compile:
                    continue
                grads = inputs.get("grad_to_none")
                try:
                    fn()  # warm-up (and compilation for torch.compile)
                    ms, lo, hi = time_ms(fn, grad_to_none=grads)
                    mib = peak_extra_mib(
                        fn, reset=lambda: [setattr(t, "grad", None) for t in grads or []]
                    )
                except Exception as exc:  # e.g. out of memory for the naive path on huge shapes
                    table(
                        f"{str(case):<44} {mode:<8} {name:<14} failed: "
                        f"{type(exc).__name__}: {str(exc)[:80]}"
                    )
                    torch.cuda.empty_cache()
                    continue
                row = dict(
                    case=case,
                    mode=mode,
                    provider=name,
                    ms=ms,
                    ms_p20=lo,
                    ms_p80=hi,
                    gbps=nbytes / ms / 1e6,
                    peak_extra_mib=mib,
                )
                rows.append(row)
                table(
                    f"{str(case):<44} {mode:<8} {name:<14} {ms:9.4f} {row['gbps']:8.0f} {mib:10.1f}"
                )
        del inputs
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    print(json.dumps({"bench": title, "device": device, "rows": rows}, default=str))
    return rows
