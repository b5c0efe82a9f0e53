"""The online log-sum-exp with entropy, as Triton device functions that the log-prob kernels
share (kernels/logprobs.py, kernels/truncated_logprobs_triton.py).

A kernel streams a row of scaled logits x over the vocabulary in blocks of BLOCK_V lanes and
keeps per lane a running max m, s = sum exp(x - m) and t = sum exp(x - m) (x - m): when the max
grows to m', both are rescaled by alpha = exp(m - m') (t also shifted by s (m - m')). At the end
``finish`` reduces the lanes to the row's log-sum-exp and entropy:

    lse = M + log S,   H = log S - T / S,   with M, S, T over the lanes rescaled to one max.

-inf entries (masked lanes, removed tokens, -inf logits) clamp to a finite -1e30 offset so that
their exp is 0 and 0 * offset stays 0. The functions are compiled with their kernel; in the CPU
interpreter kernels.dispatch swaps in their interpreted twins for the launch.
"""

from __future__ import annotations

import triton.language as tl
from triton.runtime.jit import JITFunction

NEG_BIG = -1e30  # finite "minus infinity"


def _start(BLOCK_V: tl.constexpr):
    """Empty per-lane accumulators (m, s, t), each (BLOCK_V,) float32."""
    m = tl.full([BLOCK_V], -1e30, tl.float32)
    s = tl.zeros([BLOCK_V], tl.float32)
    t = tl.zeros([BLOCK_V], tl.float32)
    return m, s, t


def _update(m, s, t, x):
    """(m, s, t) after folding in one block x (BLOCK_V,) of scaled logits (-inf: not counted)."""
    m_new = tl.maximum(m, x)
    alpha = tl.exp(m - m_new)
    d = tl.maximum(x - m_new, -1e30)  # -inf (masked lanes, -inf logits) -> finite
    e = tl.exp(d)
    t = alpha * (t + s * (m - m_new)) + e * d
    s = alpha * s + e
    return m_new, s, t


def _finish(m, s, t):
    """The row's (max M, log S, entropy H) from its lanes: lse = M + log S."""
    m_row = tl.max(m, axis=0)
    scale = tl.exp(m - m_row)
    s_row = tl.sum(s * scale, axis=0)
    t_row = tl.sum(scale * (t + s * (m - m_row)), axis=0)
    log_s = tl.log(s_row)
    return m_row, log_s, log_s - t_row / s_row


# Device functions are JITFunctions whatever TRITON_INTERPRET says: kernels.dispatch replaces
# them by interpreted twins during an interpreted launch, as it does triton's own library.
start = JITFunction(_start)
update = JITFunction(_update)
finish = JITFunction(_finish)
