"""Benchmark group_advantages: Triton vs the torch reference vs torch.compile(reference).

    python -m bench.kernel_advantages [--quick] [--no-compile] [--json out.json]

Wide groups are BroRL's regime: P prompts x G paths with G in 256..1024 (and beyond).
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/x.py` puts bench/ first on sys.path, not the repository root: add the root so
# that kernels and bench import the same way under `python -m bench.x`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kernels import group_advantages, group_advantages_reference  # noqa: E402
from bench import kernel_common as common  # noqa: E402

MODES = ("fwd",)


def cases(quick: bool) -> list[dict]:
    if quick:
        return [dict(P=512, G=1024), dict(P=8192, G=16)]
    return [dict(P=P, G=G) for G in (16, 64, 256, 512, 1024, 4096) for P in (64, 512, 8192)]


def make_inputs(case: dict, device: str) -> dict:
    g = torch.Generator(device=device).manual_seed(0)
    r = (
        torch.rand(case["P"], case["G"], generator=g, device=device) > 0.7
    ).float()  # 0/1 verifier rewards
    r[::4] = 1.0  # a quarter of the groups all-correct: degenerate
    return dict(rewards=r)


def providers(inputs: dict, mode: str) -> dict:
    r = inputs["rewards"]
    ref_compiled = common.compiled(group_advantages_reference)
    return {
        "triton": lambda: group_advantages(r),
        "torch": lambda: group_advantages_reference(r),
        "compile": lambda: ref_compiled(r),
    }


def bytes_moved(case: dict, mode: str) -> float:
    return case["P"] * case["G"] * 8 + case["P"]  # rewards in, advantages out, mask out


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    common.run("group_advantages", sys.modules[__name__], args)


if __name__ == "__main__":
    main()
