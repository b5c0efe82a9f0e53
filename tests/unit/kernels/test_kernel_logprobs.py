"""token_logprobs_entropy (PyTorch chunked path and Triton kernel) against its reference."""

import math

import pytest
import torch

from kernels import token_logprobs_entropy, token_logprobs_entropy_reference

FWD = dict(atol=1e-5, rtol=1e-4)
GRAD = dict(atol=1e-7, rtol=1e-4)


def _case(B, T, V, pad, seed=0, scale=3.0):
    """Logits as the learner sees them: a (B, T + pad, V) tensor sliced to (B, T, V)."""
    g = torch.Generator().manual_seed(seed)
    full = (torch.randn(B, T + pad, V, generator=g) * scale).requires_grad_(True)
    ids = torch.randint(0, V, (B, T), generator=g)
    g_logp, g_ent = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    return full, ids, g_logp, g_ent


def _run(fn, full, T, ids, g_logp, g_ent, **kw):
    full.grad = None
    logp, ent = fn(full[:, :T], ids, **kw)
    torch.autograd.backward([logp, ent], [g_logp, g_ent])
    return logp.detach(), ent.detach(), full.grad.clone()


def _oracle(full, T, ids, g_logp, g_ent, temperature):
    """The reference evaluated in float64: the truth the fp32 paths must approach."""
    full64 = full.detach().double().requires_grad_(True)
    logp, ent, grad = _run(
        token_logprobs_entropy_reference,
        full64,
        T,
        ids,
        g_logp.double(),
        g_ent.double(),
        temperature=temperature,
    )
    return logp.float(), ent.float(), grad.float()


def test_reference_matches_scalar_math():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(2, 3, 11, generator=g, dtype=torch.float64) * 2
    ids = torch.randint(0, 11, (2, 3), generator=g)
    logp, ent = token_logprobs_entropy_reference(z, ids, temperature=0.8)
    for b in range(2):
        for t in range(3):
            x = [v / 0.8 for v in z[b, t].tolist()]
            lse = math.log(sum(math.exp(v) for v in x))
            p = [math.exp(v - lse) for v in x]
            assert logp[b, t].item() == pytest.approx(x[ids[b, t]] - lse, abs=1e-12)
            assert ent[b, t].item() == pytest.approx(-sum(q * math.log(q) for q in p), abs=1e-12)


@pytest.mark.parametrize(
    "B,T,V,pad,temperature,chunk",
    [
        (2, 7, 1000, 3, 0.7, 128),  # chunk does not divide V; padded (sliced) T
        (3, 5, 4099, 0, 1.0, None),
        (2, 4, 777, 1, 2.0, 100),  # Triton rounds the chunk up to 128
        (1, 3, 50_257, 2, 1.3, None),  # GPT-2 vocabulary
        (1, 2, 151_936, 1, 1.0, None),  # Qwen vocabulary
        (1, 1, 151_936, 0, 0.6, 8192),
    ],
)
def test_forward_and_grads_match_reference(backend, B, T, V, pad, temperature, chunk):
    full, ids, g_logp, g_ent = _case(B, T, V, pad)
    logp, ent, grad = _run(
        token_logprobs_entropy,
        full,
        T,
        ids,
        g_logp,
        g_ent,
        temperature=temperature,
        chunk_size=chunk,
    )
    ref_logp, ref_ent, ref_grad = _oracle(full, T, ids, g_logp, g_ent, temperature)
    assert logp.dtype == ent.dtype == torch.float32 and logp.shape == ent.shape == (B, T)
    torch.testing.assert_close(logp, ref_logp, **FWD)
    torch.testing.assert_close(ent, ref_ent, **FWD)
    torch.testing.assert_close(grad, ref_grad, **GRAD)
    assert torch.all(grad[:, T:] == 0)  # the padded tail gets no gradient


def test_fp32_reference_agrees_with_paths(backend):
    """Same comparison against the plain fp32 reference (what the learner used before)."""
    full, ids, g_logp, g_ent = _case(2, 5, 3001, 0, seed=4, scale=1.0)
    out = _run(token_logprobs_entropy, full, 5, ids, g_logp, g_ent, temperature=0.9, chunk_size=512)
    ref = _run(token_logprobs_entropy_reference, full, 5, ids, g_logp, g_ent, temperature=0.9)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_grad_through_logp_only(backend):
    full, ids, g_logp, _ = _case(2, 3, 1500, 0, seed=2)
    full.grad = None
    logp, _ = token_logprobs_entropy(full, ids, chunk_size=256)
    (logp * g_logp).sum().backward()
    full64 = full.detach().double().requires_grad_(True)
    ref, _ = token_logprobs_entropy_reference(full64, ids)
    (ref * g_logp.double()).sum().backward()
    torch.testing.assert_close(full.grad, full64.grad.float(), **GRAD)


def test_masked_vocabulary_columns(backend):
    """-inf logits (padded vocabulary) behave as if those columns did not exist."""
    full, ids, g_logp, g_ent = _case(2, 4, 600, 0, seed=3)
    dead = torch.zeros(600, dtype=torch.bool)
    dead[::7] = True
    dead[590:] = True
    live_idx = (~dead).nonzero().squeeze(1)
    ids = live_idx[torch.randint(0, live_idx.numel(), (2, 4))]
    z = full.detach().masked_fill(dead, float("-inf")).requires_grad_(True)
    logp, ent, grad = _run(
        token_logprobs_entropy, z, 4, ids, g_logp, g_ent, temperature=1.5, chunk_size=64
    )
    remap = torch.full((600,), -1, dtype=torch.long)
    remap[live_idx] = torch.arange(live_idx.numel())
    live = full.detach()[..., live_idx].contiguous().requires_grad_(True)
    r_logp, r_ent, r_grad = _oracle(live, 4, remap[ids], g_logp, g_ent, 1.5)
    torch.testing.assert_close(logp, r_logp, **FWD)
    torch.testing.assert_close(ent, r_ent, **FWD)
    torch.testing.assert_close(grad[..., live_idx], r_grad, **GRAD)
    assert torch.all(grad[..., dead] == 0)


def test_extreme_logits_stay_finite(backend):
    full, ids, g_logp, g_ent = _case(1, 3, 2000, 0, seed=5, scale=1.0)
    z = (full.detach() * 60 + 500).requires_grad_(True)  # large offset, very peaked softmax
    logp, ent, grad = _run(token_logprobs_entropy, z, 3, ids, g_logp, g_ent, chunk_size=256)
    r_logp, r_ent, r_grad = _oracle(z, 3, ids, g_logp, g_ent, 1.0)
    assert torch.isfinite(logp).all() and torch.isfinite(ent).all() and torch.isfinite(grad).all()
    torch.testing.assert_close(logp, r_logp, atol=1e-3, rtol=1e-5)  # |logp| ~ 1e2..1e3
    torch.testing.assert_close(ent, r_ent, **FWD)
    torch.testing.assert_close(grad, r_grad, atol=1e-6, rtol=1e-4)


def test_torch_path_gradcheck_float64(monkeypatch):
    """The analytic backward of the chunked path, checked by finite differences."""
    monkeypatch.setenv("BRORL_TRITON", "0")
    g = torch.Generator().manual_seed(6)
    z = torch.randn(2, 3, 13, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 13, (2, 3), generator=g)
    assert torch.autograd.gradcheck(lambda x: token_logprobs_entropy(x, ids, 0.7, 5), (z,))


def test_torch_path_bf16_logits(monkeypatch):
    monkeypatch.setenv("BRORL_TRITON", "0")
    full, ids, g_logp, g_ent = _case(2, 3, 1000, 0, seed=7)
    z = full.detach().bfloat16().requires_grad_(True)
    logp, ent, grad = _run(token_logprobs_entropy, z, 3, ids, g_logp, g_ent, chunk_size=300)
    assert logp.dtype == torch.float32 and grad.dtype == torch.bfloat16
    r_logp, r_ent, r_grad = _oracle(
        z.detach().float().requires_grad_(True), 3, ids, g_logp, g_ent, 1.0
    )
    torch.testing.assert_close(logp, r_logp, **FWD)
    torch.testing.assert_close(ent, r_ent, **FWD)
    torch.testing.assert_close(
        grad.float(), r_grad, atol=1e-5, rtol=1e-2
    )  # bf16 rounding of the grad


def test_torch_path_keeps_no_vocab_sized_activation(monkeypatch):
    """Nothing of size (B, T, V) is saved for backward except the logits themselves."""
    monkeypatch.setenv("BRORL_TRITON", "0")
    full, ids, _, _ = _case(2, 8, 5000, 0)
    saved: list[torch.Tensor] = []

    def pack(x):
        saved.append(x)
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        token_logprobs_entropy(full, ids)
    big = [x for x in saved if x.numel() >= full.numel()]
    assert big and all(x.data_ptr() == full.data_ptr() for x in big)
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        token_logprobs_entropy_reference(full, ids)  # the naive path does save (B, T, V) tensors
    assert any(x.numel() >= full.numel() and x.data_ptr() != full.data_ptr() for x in saved)


@pytest.mark.parametrize(
    "shape_z,shape_ids,kw",
    [
        ((2, 3, 5), (2, 4), {}),
        ((6, 5), (6,), {}),
        ((2, 3, 5), (2, 3), {"temperature": 0.0}),
        ((2, 3, 5), (2, 3), {"chunk_size": 0}),
    ],
)
def test_rejects_bad_arguments(shape_z, shape_ids, kw):
    with pytest.raises(ValueError):
        token_logprobs_entropy(torch.randn(shape_z), torch.zeros(shape_ids, dtype=torch.long), **kw)
