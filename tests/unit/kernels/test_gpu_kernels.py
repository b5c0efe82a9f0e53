"""The Triton kernels compiled for CUDA, against the references (skipped without CUDA).

Run on a GPU machine: ``python -m pytest tests/unit/kernels -m gpu -q``.
The same comparisons run on CPU through the interpreter in the other test files; these add
what only a GPU shows: the compiled code, bf16 inputs, large shapes (int64 offsets) and
device memory.
"""

import pytest
import torch

from kernels import (
    clipped_policy_loss,
    clipped_policy_loss_reference,
    group_advantages,
    group_advantages_reference,
    token_logprobs_entropy,
    token_logprobs_entropy_reference,
)

pytestmark = pytest.mark.gpu
DEV = "cuda"
MIB = 1 << 20


@pytest.fixture(autouse=True)
def _compiled_triton(monkeypatch, launches):
    """Default dispatch (CUDA tensors -> Triton), never the interpreter; a kernel must launch."""
    monkeypatch.delenv("BRORL_TRITON", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    yield
    assert launches


def _logits(B, T, V, pad=0, dtype=torch.float32, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    full = (torch.randn(B, T + pad, V, generator=g, device=DEV) * 3).to(dtype).requires_grad_(True)
    ids = torch.randint(0, V, (B, T), generator=g, device=DEV)
    return (
        full,
        ids,
        torch.randn(B, T, generator=g, device=DEV),
        torch.randn(B, T, generator=g, device=DEV),
    )


def _fwd_bwd(fn, full, T, ids, g_logp, g_ent, **kw):
    full.grad = None
    logp, ent = fn(full[:, :T], ids, **kw)
    torch.autograd.backward([logp, ent], [g_logp, g_ent])
    return logp.detach(), ent.detach(), full.grad.detach().clone()


@pytest.mark.parametrize(
    "B,T,V,pad,temperature,chunk",
    [
        (4, 256, 151_936, 1, 1.0, None),
        (2, 301, 50_257, 3, 0.7, None),
        (3, 77, 32_001, 0, 1.3, 1024),
        (1, 5, 1000, 2, 2.0, 128),
    ],
)
def test_logprobs_fp32(B, T, V, pad, temperature, chunk):
    full, ids, gl, gh = _logits(B, T, V, pad)
    logp, ent, grad = _fwd_bwd(
        token_logprobs_entropy, full, T, ids, gl, gh, temperature=temperature, chunk_size=chunk
    )
    full64 = full.detach().double().requires_grad_(True)
    r_logp, r_ent, r_grad = _fwd_bwd(
        token_logprobs_entropy_reference,
        full64,
        T,
        ids,
        gl.double(),
        gh.double(),
        temperature=temperature,
    )
    torch.testing.assert_close(logp, r_logp.float(), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ent, r_ent.float(), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(grad, r_grad.float(), atol=1e-6, rtol=1e-4)


def test_logprobs_bf16_matches_fp32_math_on_bf16_values():
    full, ids, gl, gh = _logits(4, 128, 151_936, 1, dtype=torch.bfloat16)
    logp, ent, grad = _fwd_bwd(token_logprobs_entropy, full, 128, ids, gl, gh)
    assert logp.dtype == torch.float32 and grad.dtype == torch.bfloat16
    full32 = full.detach().float().requires_grad_(True)
    r_logp, r_ent, r_grad = _fwd_bwd(token_logprobs_entropy_reference, full32, 128, ids, gl, gh)
    torch.testing.assert_close(logp, r_logp, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ent, r_ent, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        grad.float(), r_grad, atol=1e-5, rtol=1e-2
    )  # bf16 rounding of the gradient


def test_logprobs_triton_matches_torch_chunked_path_on_cuda(monkeypatch):
    full, ids, gl, gh = _logits(2, 64, 151_936)
    out = _fwd_bwd(token_logprobs_entropy, full, 64, ids, gl, gh, temperature=0.9)
    monkeypatch.setenv("BRORL_TRITON", "0")
    chunked = _fwd_bwd(token_logprobs_entropy, full, 64, ids, gl, gh, temperature=0.9)
    for a, b in zip(out, chunked):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_logprobs_offsets_beyond_int32():
    """B*T*V > 2**31 elements: row offsets must be 64-bit. Checked on a few rows."""
    B, T, V = 1, 14_200, 151_936  # 2.16e9 elements, 4.3 GB in bf16
    g = torch.Generator(device=DEV).manual_seed(1)
    logits = torch.randn(B, T, V, generator=g, device=DEV, dtype=torch.bfloat16)
    ids = torch.randint(0, V, (B, T), generator=g, device=DEV)
    logp, ent = token_logprobs_entropy(logits, ids)
    rows = torch.tensor([0, 7_000, T - 1], device=DEV)
    r_logp, r_ent = token_logprobs_entropy_reference(logits[:, rows], ids[:, rows])
    torch.testing.assert_close(logp[:, rows], r_logp, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ent[:, rows], r_ent, atol=1e-4, rtol=1e-4)


def _peak_extra_mib(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / MIB


def test_logprobs_memory_vs_naive_log_softmax():
    full, ids, gl, gh = _logits(4, 512, 151_936)  # B*T = 2048, fp32 logits: 1.16 GiB
    logits_mib = full.numel() * 4 / MIB

    def fwd(fn):
        with torch.no_grad():
            fn(full, ids)

    def train(fn):
        full.grad = None
        logp, ent = fn(full, ids)
        torch.autograd.backward([logp, ent], [gl, gh])

    fused_fwd = _peak_extra_mib(lambda: fwd(token_logprobs_entropy))
    naive_fwd = _peak_extra_mib(lambda: fwd(token_logprobs_entropy_reference))
    fused_train = _peak_extra_mib(lambda: train(token_logprobs_entropy))
    full.grad = None
    naive_train = _peak_extra_mib(lambda: train(token_logprobs_entropy_reference))
    assert fused_fwd < 0.01 * logits_mib < naive_fwd  # no (B, T, V) temporary at all
    assert fused_train <= 1.05 * logits_mib  # just the gradient itself
    assert fused_train <= 0.25 * naive_train


@pytest.mark.parametrize("P,G", [(4096, 1024), (1000, 7), (33, 4096), (64, 1)])
@pytest.mark.parametrize("normalize_std", [True, False])
def test_group_advantages(P, G, normalize_std):
    g = torch.Generator(device=DEV).manual_seed(P + G)
    r = torch.randint(0, 3, (P, G), generator=g, device=DEV).float()
    r[::3] = 0.7
    adv, deg = group_advantages(r, normalize_std=normalize_std)
    r_adv, r_deg = group_advantages_reference(r.double(), normalize_std=normalize_std)
    assert torch.equal(deg, r_deg)
    torch.testing.assert_close(adv, r_adv.float(), atol=1e-5, rtol=1e-4)
    assert torch.all(adv[deg] == 0)


@pytest.mark.parametrize("kl_estimator", [None, "k1", "k2", "k3"])
@pytest.mark.parametrize("tis,adv_per_token", [(False, False), (True, True)])
def test_policy_loss(kl_estimator, tis, adv_per_token):
    B, T = 64, 3001
    g = torch.Generator(device=DEV).manual_seed(3)
    logp = torch.randn(B, T, generator=g, device=DEV) * 0.5 - 2
    old = logp + torch.randn(B, T, generator=g, device=DEV) * 0.3
    old[:, ::5] = logp[:, ::5]
    adv = torch.randn((B, T) if adv_per_token else (B,), generator=g, device=DEV)
    mask = torch.arange(T, device=DEV)[None] < torch.randint(
        1, T + 1, (B, 1), generator=g, device=DEV
    )
    kw = dict(eps_low=0.2, eps_high=0.28)
    if tis:
        kw["tis_weight"] = torch.rand(B, T, generator=g, device=DEV) * 2
    if kl_estimator:
        kw.update(
            ref_logp=logp + 0.2 * torch.randn(B, T, generator=g, device=DEV),
            kl_coef=0.1,
            kl_estimator=kl_estimator,
        )
    x = logp.clone().requires_grad_(True)
    loss, stats = clipped_policy_loss(x, old, adv, mask, **kw)
    (grad,) = torch.autograd.grad(loss, x)
    x64 = logp.double().requires_grad_(True)
    kw64 = {k: (v.double() if torch.is_tensor(v) else v) for k, v in kw.items()}
    r_loss, r_stats = clipped_policy_loss_reference(x64, old.double(), adv.double(), mask, **kw64)
    (r_grad,) = torch.autograd.grad(r_loss, x64)
    torch.testing.assert_close(loss, r_loss.float(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grad, r_grad.float(), atol=1e-9, rtol=1e-5)
    for k in ("clip_frac", "ratio_mean", "kl"):
        torch.testing.assert_close(stats[k], r_stats[k].float(), atol=1e-6, rtol=1e-5)
