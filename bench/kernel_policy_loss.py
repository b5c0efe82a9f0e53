"""Benchmark clipped_policy_loss: Triton vs the torch reference vs torch.compile(reference).

    python -m bench.kernel_policy_loss [--quick] [--no-compile] [--json out.json]

Cases cover the plain clipped surrogate and the full variant (k3 KL to a reference policy
and a truncated importance weight), forward and forward+backward.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/x.py` puts bench/ first on sys.path, not the repository root: add the root so
# that kernels and bench import the same way under `python -m bench.x`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kernels import clipped_policy_loss, clipped_policy_loss_reference  # noqa: E402
from bench import kernel_common as common  # noqa: E402

MODES = ("fwd", "fwd+bwd")


def cases(quick: bool) -> list[dict]:
    sizes = [(64, 4096)] if quick else [(16, 1024), (64, 4096), (512, 4096), (1024, 16384)]
    return [dict(B=B, T=T, full=full) for B, T in sizes for full in (False, True)]


def make_inputs(case: dict, device: str) -> dict:
    B, T = case["B"], case["T"]
    g = torch.Generator(device=device).manual_seed(0)
    logp = (torch.randn(B, T, generator=g, device=device) * 0.5 - 2).requires_grad_(True)
    old = logp.detach() + 0.2 * torch.randn(B, T, generator=g, device=device)
    adv = torch.randn(B, generator=g, device=device)
    mask = torch.rand(B, T, generator=g, device=device) > 0.1
    kw = dict(eps_low=0.2, eps_high=0.28)
    if case["full"]:
        kw.update(
            ref_logp=logp.detach() + 0.1 * torch.randn(B, T, generator=g, device=device),
            kl_coef=0.05,
            kl_estimator="k3",
            tis_weight=torch.rand(B, T, generator=g, device=device) * 2,
        )
    return dict(args=(logp, old, adv, mask), kw=kw, grad_to_none=[logp])


def providers(inputs: dict, mode: str) -> dict:
    args, kw = inputs["args"], inputs["kw"]
    ref_compiled = common.compiled(clipped_policy_loss_reference)
    fns = {
        "triton": lambda: clipped_policy_loss(*args, **kw),
        "torch": lambda: clipped_policy_loss_reference(*args, **kw),
        "compile": lambda: ref_compiled(*args, **kw),
    }
    if mode == "fwd":
        return fns

    def train(fn):
        return lambda: fn()[0].backward()

    return {name: train(fn) for name, fn in fns.items()}


def bytes_moved(case: dict, mode: str) -> float:
    n = case["B"] * case["T"]
    reads = (
        n * (4 + 4 + 1) + case["B"] * 4 + (n * 8 if case["full"] else 0)
    )  # logp, old, mask, adv, ref, tis
    return reads if mode == "fwd" else 2 * reads + n * 4  # bwd re-reads and writes d loss / d logp


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    common.run("clipped_policy_loss", sys.modules[__name__], args)


if __name__ == "__main__":
    main()
