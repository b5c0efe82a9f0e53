"""The GPU benchmark modules build their inputs and providers correctly (run tiny, on CPU).

Timing itself (triton.testing.do_bench) needs CUDA; here every provider but torch.compile
runs once on a tiny case, Triton through the interpreter, so the scripts are known to work
before they reach a GPU machine.
"""

import argparse

import pytest
import torch

from bench import kernel_advantages as bench_advantages, kernel_common as common
from bench import kernel_logprobs as bench_logprobs, kernel_policy_loss as bench_policy_loss

TINY = {
    bench_logprobs: dict(BT=6, V=1001, dtype="float32"),
    bench_advantages: dict(P=5, G=300),
    bench_policy_loss: dict(B=3, T=50, full=True),
}


@pytest.mark.parametrize("module", list(TINY), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_bench_providers_run_and_agree(module, monkeypatch, launches):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("BRORL_TRITON", "1")
    assert module.cases(quick=True) and module.cases(quick=False)
    case = TINY[module]
    inputs = module.make_inputs(case, "cpu")
    for mode in module.MODES:
        assert module.bytes_moved(case, mode) > 0
        fns = module.providers(inputs, mode)
        assert {"triton", "torch", "compile"} <= set(fns)
        results = {}
        for name, fn in fns.items():
            if name == "compile":
                continue
            for t in inputs.get("grad_to_none") or []:
                t.grad = None
            out = fn()
            grads = [t.grad.clone() for t in inputs.get("grad_to_none") or [] if t.grad is not None]
            results[name] = (out, grads)
        if mode != "fwd":  # the training providers must produce the same gradients
            ref = results["torch"][1]
            for name, (_, grads) in results.items():
                for a, b in zip(grads, ref):
                    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)
    assert (
        "_logprobs_fwd_kernel" in launches
        or "_group_adv_kernel" in launches
        or "_policy_loss_fwd_kernel" in launches
    )


def test_bench_refuses_cpu_only_machine(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = argparse.Namespace(quick=True, no_compile=True, json=None)
    with pytest.raises(SystemExit, match="CUDA"):
        common.run("x", bench_advantages, args)
