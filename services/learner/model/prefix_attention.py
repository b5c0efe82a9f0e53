"""The learner's CPU attention: Hugging Face's eager attention without its copies, and a shared
prompt's keys and values read once per chunk instead of once per path.

Hugging Face's eager attention repeats every key/value head for its query heads (grouped-query
attention: ``repeat_kv``) and, after a shared prompt (forward.py), runs on a cache whose prompt
rows are a view expanded to the chunk's b paths, concatenated with each path's own rows. On a CPU
with native bf16 (where the matrix multiplies are 4x cheaper than in fp32) those copies — the
expanded cache's concatenation, the repeated heads, their transposes and the gradient's sums back
— took about as long as every matrix multiply of the update together (docs/performance.md).

Here the query heads are grouped under their key/value head instead, and with a shared prompt
(``shared_prompt``) the scores split in two blocks that share one softmax:

* the prompt's block: every path's queries against the one prompt's keys, a single matrix
  multiply per key/value head with the paths folded into its rows, whose gradient sums the
  paths' contributions to the prompt inside the multiply;
* the completion's block: each path's queries against its own keys, causal.

Registered as ``ATTENTION`` (pretrained.attention_backend() names it on CPU); a model loaded with
it runs like eager attention wherever no prompt is shared (the prompt's pass, a full sequence, the
warm-up forward). ``reference_attention`` is the float64 twin the tests hold it to.

Shapes: b paths (rows), h query heads, k key/value heads, g = h / k, q query positions, s key
positions, P prompt positions, d head dimension.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Sequence

import torch

ATTENTION = "brorl_cpu"

# per layer (its ``layer_idx``): the shared prompt's (1, k, P, d) keys and values, after rotary
_PROMPT: contextvars.ContextVar[Sequence[tuple[torch.Tensor, torch.Tensor]] | None] = (
    contextvars.ContextVar("brorl_shared_prompt", default=None)
)


@contextlib.contextmanager
def shared_prompt(layers: Sequence[tuple[torch.Tensor, torch.Tensor]]):
    """Inside: a forward of the model (no cache) is every path's continuation of the prompt whose
    per-layer keys and values ``layers`` holds (a one-row cache: ``(keys, values)`` each
    (1, k, P, d)); the positions the caller passes must continue the prompt's."""
    token = _PROMPT.set(layers)
    try:
        yield
    finally:
        _PROMPT.reset(token)


def serves_shared_prompt(model) -> bool:
    """Whether ``model`` (or the module a DeepSpeed engine wraps) can run a continuation under
    ``shared_prompt``: loaded with ``ATTENTION``, and no layer under a sliding window (the
    prompt's block has no mask to hold one)."""
    config = getattr(model, "module", model).config
    sliding = "sliding_attention" in (getattr(config, "layer_types", None) or ())
    return getattr(config, "_attn_implementation", "") == ATTENTION and not sliding


def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Hugging Face's attention interface: query (b, h, q, d), key and value (b, k, s, d) as the
    layer made them, the eager mask (b, 1, q, s) added to the scores or None; returns the
    output (b, q, h, d) and no weights."""
    prompt = _PROMPT.get()
    dropout = dropout if module.training else 0.0
    if prompt is None:  # a sliding window, if the layer has one, is in the mask
        return _grouped(query, key, value, attention_mask, scaling, dropout), None
    if kwargs.get("sliding_window") is not None:
        raise ValueError("a shared prompt under a sliding window (see serves_shared_prompt)")
    keys, values = prompt[module.layer_idx]
    return _after_prompt(query, key, value, keys, values, attention_mask, scaling, dropout), None


def _grouped(query, key, value, mask, scaling, dropout):
    """Eager attention with the query heads grouped under their key/value head (no repeat)."""
    b, h, q, d = query.shape
    k, s = key.shape[1], key.shape[2]
    # (b, k, g*q, d): query head i reads key/value head i // g; scaled here, the smaller side
    qg = (query * scaling).reshape(b, k, (h // k) * q, d)
    scores = torch.matmul(qg, key.transpose(2, 3))  # (b, k, g*q, s)
    if mask is not None:  # (b, 1, q, s) -> the same mask for each of a key head's g query heads
        scores = (scores.view(b, k, h // k, q, s) + mask[:, :, None]).view(b, k, -1, s)
    probs = _softmax(scores, query.dtype, dropout)
    out = torch.matmul(probs, value)  # (b, k, g*q, d)
    return out.view(b, h, q, d).transpose(1, 2).contiguous()  # (b, q, h, d)


def _after_prompt(query, key, value, prompt_keys, prompt_values, mask, scaling, dropout):
    """Each path's queries against the shared prompt's keys and its own: one softmax over both.
    Everything runs in the layout (k, b, g*q, ...), a key/value head's rows of every path
    together, so each of the prompt's blocks is a single multiply."""
    b, h, q, d = query.shape
    k, P = prompt_keys.shape[1], prompt_keys.shape[2]
    g = h // k
    rows = g * q  # a path's query rows under one key/value head
    # (k, b, g*q, d); scaled as in _grouped
    qk = (query * scaling).reshape(b, k, rows, d).transpose(0, 1).contiguous()
    on_prompt = torch.matmul(qk.view(k, b * rows, d), prompt_keys[0].transpose(1, 2))
    own_keys = key.transpose(0, 1).reshape(k * b, q, d)  # (k*b, q, d)
    on_own = torch.bmm(qk.view(k * b, rows, d), own_keys.transpose(1, 2))  # (k*b, g*q, q)
    on_own = on_own.view(k, b, g, q, q)
    if mask is not None:  # the continuation's causal mask (b, 1, q, q)
        on_own = on_own + mask.transpose(0, 1)[:, :, None]
    scores = torch.cat([on_prompt.view(k, b, rows, P), on_own.view(k, b, rows, q)], dim=-1)
    from_prompt, from_own = _softmax(scores, query.dtype, dropout).split([P, q], dim=-1)
    out = torch.matmul(from_prompt.reshape(k, b * rows, P), prompt_values[0])  # (k, b*g*q, d)
    own_values = value.transpose(0, 1).reshape(k * b, q, d)  # (k*b, q, d)
    out = out.view(k * b, rows, d) + torch.bmm(from_own.reshape(k * b, rows, q), own_values)
    # (k, b, g, q, d) -> (b, q, k, g, d) = (b, q, h, d)
    return out.view(k, b, g, q, d).permute(1, 3, 0, 2, 4).reshape(b, q, h, d)


def _softmax(scores, dtype, dropout):
    """Softmax over the last dimension in float32 or wider (as eager attention), back in the
    query's dtype."""
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    probs = probs.to(dtype)
    return torch.nn.functional.dropout(probs, p=dropout, training=dropout > 0)


def reference_attention(query, key, value, prompt_keys=None, prompt_values=None, scaling=None):
    """The float64 twin: every path's keys and values as one sequence (the prompt's rows repeated
    per path), every key/value head repeated for its query heads, a causal mask over the path's
    own positions; returns (b, q, h, d)."""
    b, h, q, d = query.shape
    key, value = key.double(), value.double()
    if prompt_keys is not None:
        key = torch.cat([prompt_keys.double().expand(b, -1, -1, -1), key], dim=2)
        value = torch.cat([prompt_values.double().expand(b, -1, -1, -1), value], dim=2)
    s = key.shape[2]
    g = h // key.shape[1]
    key, value = key.repeat_interleave(g, dim=1), value.repeat_interleave(g, dim=1)
    scores = query.double() @ key.transpose(2, 3) * (scaling if scaling else d**-0.5)
    visible = torch.ones(q, s, dtype=torch.bool).tril(diagonal=s - q)  # (q, s) causal
    scores = scores.masked_fill(~visible, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ value).transpose(1, 2)


def register() -> None:
    """Make ``ATTENTION`` a name Hugging Face's models load with (its mask: the eager one)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(ATTENTION, attention)
    AttentionMaskInterface.register(ATTENTION, eager_mask)


register()
