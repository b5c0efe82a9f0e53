"""Benchmark token_logprobs_entropy: Triton vs the torch reference vs torch.compile(reference).

    python -m bench.kernel_logprobs [--quick] [--no-compile] [--json out.json]

Providers: ``triton`` (the kernel), ``torch`` (reference: full log_softmax, autograd),
``compile`` (torch.compile of the reference), ``torch-chunked`` (the CPU path run on
CUDA, BRORL_TRITON=0). Modes: ``fwd`` (no autograd: old / reference log-probs) and
``fwd+bwd`` (a training step, gradients of both outputs into the logits).
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/x.py` puts bench/ first on sys.path, not the repository root: add the root so
# that kernels and bench import the same way under `python -m bench.x`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kernels import token_logprobs_entropy, token_logprobs_entropy_reference  # noqa: E402
from bench import kernel_common as common  # noqa: E402

MODES = ("fwd", "fwd+bwd")


def cases(quick: bool) -> list[dict]:
    if quick:
        return [
            dict(BT=2048, V=151_936, dtype="bfloat16"),
            dict(BT=2048, V=50_257, dtype="float32"),
        ]
    out = []
    for dtype in ("bfloat16", "float32"):
        for BT in (2048, 8192):
            for V in (32_000, 50_257, 128_256, 151_936):
                out.append(dict(BT=BT, V=V, dtype=dtype))
    return out


def make_inputs(case: dict, device: str) -> dict:
    B = 4
    T = case["BT"] // B
    g = torch.Generator(device=device).manual_seed(0)
    dtype = getattr(torch, case["dtype"])
    logits = (
        (torch.randn(B, T, case["V"], generator=g, device=device) * 2)
        .to(dtype)
        .requires_grad_(True)
    )
    ids = torch.randint(0, case["V"], (B, T), generator=g, device=device)
    return dict(
        logits=logits, ids=ids, grad_to_none=[logits], temperature=case.get("temperature", 1.0)
    )


def providers(inputs: dict, mode: str) -> dict:
    logits, ids, tau = inputs["logits"], inputs["ids"], inputs["temperature"]
    ref_compiled = common.compiled(token_logprobs_entropy_reference)
    fns = {
        "triton": lambda: token_logprobs_entropy(logits, ids, tau),
        "torch-chunked": common.with_env(
            lambda: token_logprobs_entropy(logits, ids, tau), BRORL_TRITON="0"
        ),
        "torch": lambda: token_logprobs_entropy_reference(logits, ids, tau),
        "compile": lambda: ref_compiled(logits, ids, tau),
    }

    def no_grad(fn):
        def call():
            with torch.no_grad():
                return fn()

        return call

    def train(fn):
        def call():
            logp, ent = fn()
            (logp.sum() + 0.01 * ent.sum()).backward()

        return call

    wrap = no_grad if mode == "fwd" else train
    return {name: wrap(fn) for name, fn in fns.items()}


def bytes_moved(case: dict, mode: str) -> float:
    elt = torch.finfo(getattr(torch, case["dtype"])).bits // 8
    logits = case["BT"] * case["V"] * elt
    rows = case["BT"] * (8 + 4 + 4)  # ids in, logp and entropy out
    return logits + rows if mode == "fwd" else 3 * logits + 2 * rows  # fwd read + bwd read/write


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    common.run("token_logprobs_entropy", sys.modules[__name__], args)


if __name__ == "__main__":
    main()
