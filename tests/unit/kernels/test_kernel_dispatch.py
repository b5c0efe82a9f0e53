"""Dispatch between Triton and PyTorch, lazy jitting, and the import boundary of `kernels`."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import dispatch

ROOT = Path(__file__).resolve().parents[3]


def test_cpu_tensors_take_the_pytorch_path_by_default(monkeypatch):
    monkeypatch.delenv("BRORL_TRITON", raising=False)
    assert not dispatch.use_triton(torch.zeros(2))
    monkeypatch.setenv("BRORL_TRITON", "0")
    assert not dispatch.use_triton(torch.zeros(2))


def test_forcing_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv("BRORL_TRITON", "1")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        dispatch.use_triton(torch.zeros(2))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert dispatch.use_triton(torch.zeros(2))


def test_lazy_kernel_jits_per_interpreter_mode(monkeypatch):
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    def _probe(x_ptr):
        pass

    kernel = dispatch.LazyKernel(_probe)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert isinstance(kernel.jitted(), InterpretedFunction)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert isinstance(kernel.jitted(), JITFunction)
    assert set(kernel._jitted) == {True, False}


def test_interpreter_restores_triton_stdlib(monkeypatch):
    import triton.language as tl

    before = tl.sum
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("BRORL_TRITON", "1")
    from kernels import group_advantages

    group_advantages(torch.rand(3, 5))
    assert tl.sum is before


def test_next_power_of_2():
    assert [dispatch.next_power_of_2(n) for n in (1, 2, 3, 1000, 1024, 151_936)] == [
        1,
        2,
        4,
        1024,
        1024,
        262_144,
    ]


def test_import_needs_no_gpu_and_runs_interpreter_after_plain_import():
    """A fresh process: import kernels (and triton) first, switch on the interpreter after."""
    code = (
        "import os, torch, triton, kernels\n"
        "os.environ.update(TRITON_INTERPRET='1', BRORL_TRITON='1')\n"
        "z = torch.randn(2, 3, 300, requires_grad=True); ids = torch.randint(0, 300, (2, 3))\n"
        "lp, ent = kernels.token_logprobs_entropy(z, ids, 0.9, 64)\n"
        "r_lp, r_ent = kernels.token_logprobs_entropy_reference(z, ids, 0.9)\n"
        "assert torch.allclose(lp, r_lp, atol=1e-5) and torch.allclose(ent, r_ent, atol=1e-5)\n"
        "print('ok', torch.cuda.is_available())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "BRORL_TRITON")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")


def test_kernels_are_jitted_lazily_and_triton_stays_in_kernels():
    """A module-level @triton.jit would freeze the interpreter choice at import (see dispatch)."""
    for path in (ROOT / "kernels").glob("*.py"):
        decorated = [
            ln for ln in path.read_text().splitlines() if ln.lstrip().startswith("@triton.jit")
        ]
        assert not decorated, f"{path}: wrap kernels in dispatch.LazyKernel"
    # the CPU benchmark of the learner's log-prob path must run where triton is absent
    text = (ROOT / "bench" / "logprob_memory.py").read_text()
    assert "import triton" not in text and "from triton" not in text
