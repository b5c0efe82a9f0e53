"""The online log-sum-exp with entropy (kernels/online_softmax.py), the device functions both
log-prob kernels call, run in triton's CPU interpreter against torch on irregular rows: several
blocks, a ragged last block, -inf logits, one huge logit, a row of one token."""

from __future__ import annotations

import inspect

import pytest
import torch
import triton.language as tl

from kernels import logprobs, online_softmax, truncated_logprobs_triton
from kernels.dispatch import LazyKernel


def _row_kernel(x_ptr, lse_ptr, ent_ptr, V, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_V)
    m, s, t = online_softmax.start(BLOCK_V)
    for start in range(0, V, BLOCK_V):
        cols = start + offs
        x = tl.load(x_ptr + row * V + cols, mask=cols < V, other=float("-inf"))
        m, s, t = online_softmax.update(m, s, t, x)
    m_row, log_s, entropy = online_softmax.finish(m, s, t)
    tl.store(lse_ptr + row, m_row + log_s)
    tl.store(ent_ptr + row, entropy)


ROW = LazyKernel(_row_kernel)


@pytest.mark.parametrize("V, block", [(37, 8), (8, 8), (1, 2), (100, 64)])
def test_lse_and_entropy_match_torch(monkeypatch, V, block):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    g = torch.Generator().manual_seed(V)
    x = torch.randn(4, V, generator=g) * 3
    if V > 2:
        x[1, ::3] = float("-inf")  # removed tokens
        x[2, V // 2] = 80.0  # one dominant logit: the running max jumps
    lse, ent = torch.empty(4), torch.empty(4)
    ROW[(4,)](x, lse, ent, V, BLOCK_V=block)
    logq = x.log_softmax(-1)
    want_ent = -(logq.exp() * logq.clamp(min=online_softmax.NEG_BIG)).sum(-1)
    assert torch.allclose(lse, x.logsumexp(-1), atol=1e-5)
    assert torch.allclose(ent, want_ent, atol=1e-5)


def test_both_log_prob_kernels_use_the_shared_loop():
    for kernel in (logprobs._logprobs_fwd_kernel, truncated_logprobs_triton._trunc_fwd_kernel):
        src = inspect.getsource(kernel)
        for fn in ("start", "update", "finish"):
            assert f"online_softmax.{fn}(" in src, (kernel.__name__, fn)
        assert "alpha" not in src, kernel.__name__  # no inline copy of the rescaling
