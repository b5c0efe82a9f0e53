"""The learner's CPU attention against its float64 twin (every path's keys and values as one
sequence, heads repeated, causal mask): outputs and gradients on irregular shapes, with and
without a shared prompt."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from services.learner.model import prefix_attention as pa


def causal_mask(b: int, q: int, s: int) -> torch.Tensor:
    """(b, 1, q, s) additive mask as Hugging Face's eager mask makes it: 0 where visible."""
    visible = torch.ones(q, s, dtype=torch.bool).tril(diagonal=s - q)
    mask = torch.zeros(q, s, dtype=torch.float64).masked_fill(
        ~visible, torch.finfo(torch.float64).min
    )
    return mask.expand(b, 1, q, s)


def inputs(b, h, k, q, P, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(b, q, h, d, generator=g, dtype=torch.float64).transpose(1, 2)  # as a layer
    key = torch.randn(b, k, q, d, generator=g, dtype=torch.float64)
    value = torch.randn(b, k, q, d, generator=g, dtype=torch.float64)
    pk = torch.randn(1, k, P, d, generator=g, dtype=torch.float64)
    pv = torch.randn(1, k, P, d, generator=g, dtype=torch.float64)
    return [t.requires_grad_() for t in (query, key, value, pk, pv)]


LAYER = SimpleNamespace(training=False, layer_idx=1)
SHAPES = [(3, 4, 2, 5, 7, 8), (1, 6, 3, 1, 2, 4), (5, 4, 4, 3, 1, 2), (2, 2, 1, 6, 9, 16)]


@pytest.mark.parametrize("b,h,k,q,P,d", SHAPES)
def test_after_a_shared_prompt_outputs_and_gradients_equal_the_twins(b, h, k, q, P, d):
    query, key, value, pk, pv = inputs(b, h, k, q, P, d)
    scaling = d**-0.5
    other = (torch.zeros_like(pk), torch.zeros_like(pv))  # layer 0's: must not be read
    with pa.shared_prompt([other, (pk, pv)]):
        got, _ = pa.attention(LAYER, query, key, value, causal_mask(b, q, q), scaling)
    want = pa.reference_attention(query, key, value, pk, pv, scaling)  # (b, q, h, d)
    assert got.shape == (b, q, h, d)
    assert torch.allclose(got, want, rtol=1e-9, atol=1e-10)
    weights = torch.randn(
        b, q, h, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    grads = [
        torch.autograd.grad((out * weights).sum(), (query, key, value, pk, pv))
        for out in (got, want)
    ]
    for name, a, w in zip(("query", "key", "value", "prompt keys", "prompt values"), *grads):
        assert torch.allclose(a, w, rtol=1e-9, atol=1e-10), name


@pytest.mark.parametrize("b,h,k,q,P,d", SHAPES)
def test_without_a_prompt_it_is_causal_attention_over_its_own_keys(b, h, k, q, P, d):
    query, key, value, _, _ = inputs(b, h, k, q, P, d, seed=2)
    got, _ = pa.attention(LAYER, query, key, value, causal_mask(b, q, q), d**-0.5)
    assert torch.allclose(got, pa.reference_attention(query, key, value), rtol=1e-9, atol=1e-10)


def test_a_prompt_changes_the_output():
    query, key, value, pk, pv = inputs(2, 4, 2, 3, 5, 8)
    alone, _ = pa.attention(LAYER, query, key, value, causal_mask(2, 3, 3), 8**-0.5)
    with pa.shared_prompt([(pk, pv)] * 2):
        after, _ = pa.attention(LAYER, query, key, value, causal_mask(2, 3, 3), 8**-0.5)
    assert not torch.allclose(alone, after)


def test_the_prompt_is_read_only_inside_its_context():
    query, key, value, pk, pv = inputs(2, 4, 2, 3, 5, 8)
    with pa.shared_prompt([(pk, pv)] * 2):
        pass
    got, _ = pa.attention(LAYER, query, key, value, causal_mask(2, 3, 3), 8**-0.5)
    assert torch.allclose(got, pa.reference_attention(query, key, value), rtol=1e-9, atol=1e-10)


def test_a_shared_prompt_under_a_sliding_window_is_refused():
    query, key, value, pk, pv = inputs(1, 2, 1, 2, 1, 4)
    with pa.shared_prompt([(pk, pv)] * 2), pytest.raises(ValueError, match="sliding window"):
        pa.attention(LAYER, query, key, value, None, 0.5, sliding_window=4)
