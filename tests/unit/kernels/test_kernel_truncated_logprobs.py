"""truncated_logprobs_entropy (chunked PyTorch path, Triton kernels) against its reference.

Layers of trust: plain Python loops check the vectorised float64 reference on small rows
(ties included); the op run in float64 must match that reference to ~1e-10 (values and
autograd gradients, irregular shapes, V = 151,936); the float32 paths must match float64 math
over the keep set the float32 reference picks (float32 vs float64 rounding may move a top-p
cut by one token of mass ~1/V, which is a different question); the per-row cut-off summary
must rebuild the reference's keep mask bit for bit.
"""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernels import (
    token_logprobs_entropy_reference,
    truncate_logits_reference,
    truncated_logprobs_entropy,
    truncated_logprobs_entropy_reference,
)
from kernels import truncated_logprobs as truncated_module
from kernels.cutoffs import MASKED, keep_mask, row_cutoffs

FWD = dict(atol=1e-5, rtol=1e-4)
GRAD = dict(atol=1e-6, rtol=1e-4)
TIGHT = dict(atol=1e-10, rtol=1e-9)
QWEN = 151_936

# (B, T, V, pad, chunk_rows, logit scale, temperatures, top_k, top_p) per path; pad > 0 slices
# (B, T + pad, V) to (B, T, V), a view that cannot be flattened; scale 0 = integer logits (ties)
CASES = {
    "mixed": (3, 5, 37, 2, 4, 3.0, [0.7, 1.3, 0.45], [5, -1, 37], [0.9, 0.3, 1.0]),
    "k1-ties": (4, 3, 29, 0, 5, 0.0, [1.5, 0.8, 0.6, 2.0], [1, 5, -1, 29], [1.0, 0.9, 0.3, 0.9]),
    "odd": (5, 7, 1001, 1, 3, 2.0, [0.9, 1.7, 0.5, 1.1, 0.8], [-1, 1, 5, 1001, 40], [0.3] * 5),
    "deep-nucleus": (2, 3, 2053, 1, None, 0.3, [0.9, 1.7], [-1, 1500], [0.9, 0.95]),
    "mid-nucleus": (3, 2, 5003, 0, 2, 1.5, [0.9, 1.2, 0.7], [-1, 300, -1], [0.6, 0.999, 0.9]),
    "qwen": (1, 3, QWEN, 1, 2, 3.0, [0.8], [40], [0.95]),
    "qwen-wide": (2, 2, QWEN, 0, None, 1.0, [1.2, 0.6], [-1, QWEN], [0.9, 0.3]),
}


def _case(name, dtype=torch.float32, seed=0):
    B, T, V, pad, rows, scale, temps, ks, ps = CASES[name]
    g = torch.Generator().manual_seed(seed)
    if scale == 0:
        full = torch.randint(-3, 4, (B, T + pad, V), generator=g).to(dtype)
    else:
        full = (torch.randn(B, T + pad, V, generator=g) * scale).to(dtype)
    ids = torch.randint(0, V, (B, T), generator=g)
    # the tail of each path is padding: id 0, no upstream gradient (the learner's loss mask)
    mask = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,), generator=g)[:, None]
    ids = ids.masked_fill(~mask, 0)
    g_logp = torch.randn(B, T, generator=g, dtype=dtype) * mask
    g_ent = torch.randn(B, T, generator=g, dtype=dtype) * mask
    settings = dict(temperature=torch.tensor(temps), top_k=torch.tensor(ks), top_p=torch.tensor(ps))
    return full.requires_grad_(True), T, ids, g_logp, g_ent, settings, rows


def _run(fn, full, T, ids, g_logp, g_ent, **kw):
    full.grad = None
    logp, ent = fn(full[:, :T], ids, **kw)
    torch.autograd.backward([logp, ent], [g_logp, g_ent])
    return logp.detach(), ent.detach(), full.grad.clone()


def _oracle_on_reference_mask(full, T, ids, g_logp, g_ent, settings):
    """Float64 math over the tokens the float32 reference keeps."""
    temps = settings["temperature"]
    x32 = full.detach()[:, :T] / temps[:, None, None]
    keep = truncate_logits_reference(x32, settings["top_k"], settings["top_p"], ids) > MASKED
    full64 = full.detach().double().requires_grad_(True)
    z = (full64[:, :T] / temps.double()[:, None, None]).masked_fill(~keep, float("-inf"))
    logq = z.log_softmax(-1)
    logp = logq.gather(-1, ids[..., None]).squeeze(-1)
    ent = -(logq.exp() * logq.masked_fill(~keep, 0)).sum(-1)
    torch.autograd.backward([logp, ent], [g_logp.double(), g_ent.double()])
    return logp.detach().float(), ent.detach().float(), full64.grad.float()


def _python_loops(scaled, ids, top_k, top_p):
    """The rule in plain Python, one position at a time (kernels.cutoffs states it)."""
    B, T, V = scaled.shape
    logp, ent = torch.zeros(B, T, dtype=torch.float64), torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            x = scaled[b, t].tolist()
            ranked = sorted(range(V), key=lambda v: (-x[v], v))
            if 0 < top_k[b] < V:
                ranked = [v for v in ranked if x[v] >= x[ranked[top_k[b] - 1]]]  # ties stay
            if top_p[b] < 1:
                top = max(x[v] for v in ranked)
                z = sum(math.exp(x[v] - top) for v in ranked)
                kept, mass = [], 0.0
                for v in ranked:
                    if mass >= top_p[b]:
                        break
                    kept.append(v)
                    mass += math.exp(x[v] - top) / z
                ranked = kept
            kept = set(ranked) | {int(ids[b, t])}
            lse = math.log(sum(math.exp(x[v]) for v in kept))
            logp[b, t] = x[int(ids[b, t])] - lse
            ent[b, t] = -sum(math.exp(x[v] - lse) * (x[v] - lse) for v in kept)
    return logp, ent


@pytest.mark.parametrize("name", ["mixed", "k1-ties"])
def test_reference_matches_python_loops(name):
    full, T, ids, _, _, s, _ = _case(name, torch.float64)
    logp, ent = truncated_logprobs_entropy_reference(full.detach()[:, :T], ids, **s)
    scaled = full.detach()[:, :T] / s["temperature"].double()[:, None, None]
    want_logp, want_ent = _python_loops(scaled, ids, s["top_k"].tolist(), s["top_p"].tolist())
    torch.testing.assert_close(logp, want_logp, atol=1e-12, rtol=0)
    torch.testing.assert_close(ent, want_ent, atol=1e-12, rtol=0)


def test_ties_hand_made():
    """top-k keeps every tie of its threshold; top-p cuts a tie by id, lowest first."""
    x = torch.tensor([[[1.0, 3.0, 0.0, 3.0, 3.0, 2.0], [-50.0, 2.0, 2.0, 2.0, 2.0, -50.0]]])
    ids = torch.tensor([[5, 4]])
    logp, _ = truncated_logprobs_entropy(x.double(), ids, 1.0, torch.tensor([2]), 1.0)
    # top-k 2 keeps the three 3.0s; the sampled 2.0 is added
    assert logp[0, 0].item() == pytest.approx(2.0 - math.log(3 * math.exp(3.0) + math.exp(2.0)))
    # top-p 0.5 over four equal 2.0s: masses above are 0, .25, .5, .75 -> ids 1 and 2 kept;
    # the sampled id 4 is added
    logp, _ = truncated_logprobs_entropy(x.double(), ids, 1.0, -1, torch.tensor([0.5]))
    assert logp[0, 1].item() == pytest.approx(-math.log(3.0))
    cut = row_cutoffs(x[0].double(), torch.tensor([2, -1]), torch.tensor([0.5, 0.5]))
    assert cut[0].tolist() == [3.0, 2.0] and cut[1].tolist() == [3, 2]  # (lo, v_lo) per row
    kept = keep_mask(x[0].double(), *cut, ids[0])
    # row 0: top-k 2 keeps the 3.0s, then top-p 0.5 the first two of them (mass above: 0, 1/3)
    assert kept.tolist() == [
        [False, True, False, True, False, True],
        [False, True, True, False, True, False],
    ]


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("layout", ["dense", "sparse"])
def test_float64_op_matches_float64_reference(monkeypatch, name, layout):
    """Both ways a chunk runs: densely on (R, V), or on the flat list of its kept tokens."""
    monkeypatch.setenv("BRORL_TRITON", "0")
    monkeypatch.setattr(truncated_module, "_SPARSE_PER_ROW", 10**9 if layout == "sparse" else 0)
    monkeypatch.setattr(truncated_module, "_SPARSE_SHARE", 1.0)
    full, T, ids, g_logp, g_ent, s, rows = _case(name, torch.float64)
    got = _run(truncated_logprobs_entropy, full, T, ids, g_logp, g_ent, chunk_rows=rows, **s)
    want = _run(truncated_logprobs_entropy_reference, full, T, ids, g_logp, g_ent, **s)
    assert got[0].dtype == torch.float64
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TIGHT)
    assert torch.all(got[2][:, T:] == 0)  # the sliced-off tail gets no gradient
    assert torch.isfinite(got[2]).all()


@pytest.mark.parametrize("name", list(CASES))
def test_float32_paths_match_float64_math(backend, name):
    full, T, ids, g_logp, g_ent, s, rows = _case(name, seed=1)
    logp, ent, grad = _run(truncated_logprobs_entropy, full, T, ids, g_logp, g_ent, **s)
    r_logp, r_ent, r_grad = _oracle_on_reference_mask(full, T, ids, g_logp, g_ent, s)
    assert logp.dtype == ent.dtype == torch.float32 and grad.dtype == torch.float32
    torch.testing.assert_close(logp, r_logp, **FWD)
    torch.testing.assert_close(ent, r_ent, **FWD)
    torch.testing.assert_close(grad, r_grad, **GRAD)


def test_bf16_logits(backend):
    """bf16 logits: float32 math on the bf16 values, a bf16 gradient."""
    full, T, ids, g_logp, g_ent, s, _ = _case("odd", seed=4)
    z = full.detach().bfloat16().requires_grad_(True)
    logp, ent, grad = _run(truncated_logprobs_entropy, z, T, ids, g_logp, g_ent, **s)
    assert logp.dtype == torch.float32 and grad.dtype == torch.bfloat16
    z32 = z.detach().float().requires_grad_(True)
    r_logp, r_ent, r_grad = _oracle_on_reference_mask(z32, T, ids, g_logp, g_ent, s)
    torch.testing.assert_close(logp, r_logp, **FWD)
    torch.testing.assert_close(ent, r_ent, **FWD)
    torch.testing.assert_close(grad.float(), r_grad, atol=1e-5, rtol=1e-2)  # bf16 rounding


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cutoffs_rebuild_the_reference_mask_exactly(name, dtype):
    full, T, ids, _, _, s, _ = _case(name, dtype, seed=2)
    scaled = full.detach()[:, :T] / s["temperature"].to(dtype)[:, None, None]  # (B, T, V)
    want = truncate_logits_reference(scaled, s["top_k"], s["top_p"], ids) > MASKED
    B, _, V = scaled.shape
    x = scaled.reshape(B * T, V)
    per_row = {k: s[k].repeat_interleave(T) for k in ("top_k", "top_p")}
    cut = row_cutoffs(x, per_row["top_k"], per_row["top_p"])
    assert torch.equal(keep_mask(x, *cut, ids.reshape(-1)), want.reshape(B * T, V))


def test_untruncated_settings_equal_the_plain_log_softmax(backend):
    full, T, ids, g_logp, g_ent, _, _ = _case("odd", seed=3)
    temps = torch.tensor([0.9, 1.7, 0.5, 1.1, 0.8])
    got = _run(truncated_logprobs_entropy, full, T, ids, g_logp, g_ent, temperature=temps,
               top_k=-1, top_p=1.0, chunk_rows=4)  # fmt: skip
    full64 = full.detach().double().requires_grad_(True)
    for b in range(5):
        want = _run(token_logprobs_entropy_reference, full64, T, ids, g_logp.double(),
                    g_ent.double(), temperature=float(temps[b]))  # fmt: skip
        torch.testing.assert_close(got[0][b], want[0][b].float(), **FWD)
        torch.testing.assert_close(got[1][b], want[1][b].float(), **FWD)
        torch.testing.assert_close(got[2][b], want[2][b].float(), **GRAD)


@pytest.mark.parametrize("sparse_per_row", [0, 10**9])
def test_gradcheck_float64(monkeypatch, sparse_per_row):
    """The chunked backward, checked by finite differences (cut-offs held by the data)."""
    monkeypatch.setenv("BRORL_TRITON", "0")
    monkeypatch.setattr(truncated_module, "_SPARSE_PER_ROW", sparse_per_row)
    monkeypatch.setattr(truncated_module, "_SPARSE_SHARE", 1.0)
    g = torch.Generator().manual_seed(6)
    z = torch.randn(3, 3, 11, generator=g, dtype=torch.float64) * 2
    z.requires_grad_(True)
    ids = torch.randint(0, 11, (3, 3), generator=g)
    s = dict(temperature=torch.tensor([0.7, 1.3, 0.9]), top_k=torch.tensor([4, -1, 6]),
             top_p=torch.tensor([1.0, 0.6, 0.8]))  # fmt: skip
    fn = lambda x: truncated_logprobs_entropy(x, ids, **s, chunk_rows=5)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (z,))


class _Allocations(TorchDispatchMode):
    """Bytes of every new storage an op creates (views of existing storage are not counted)."""

    def __init__(self, known: list[torch.Tensor]):
        super().__init__()
        self.sizes: list[tuple[str, int]] = []
        self._seen = {t.untyped_storage().data_ptr() for t in known}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                ptr = t.untyped_storage().data_ptr()
                if ptr not in self._seen:
                    self._seen.add(ptr)
                    self.sizes.append((str(func), t.untyped_storage().nbytes()))
        return out


def test_no_vocab_sized_temporary_or_saved_tensor(monkeypatch):
    """Forward allocates nothing near (B, T, V); backward only the gradient; logits alone saved."""
    monkeypatch.setenv("BRORL_TRITON", "0")
    full, T, ids, g_logp, g_ent, s, _ = _case("odd")
    logits = full.detach()[:, :T].contiguous().requires_grad_(True)
    full_bytes = logits.numel() * 4
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x) or x, lambda x: x):
        with _Allocations([logits]) as fwd:
            logp, ent = truncated_logprobs_entropy(logits, ids, **s, chunk_rows=4)
    assert max(n for _, n in fwd.sizes) <= full_bytes / 4, sorted(fwd.sizes, key=lambda a: -a[1])
    big = [x for x in saved if x.numel() >= logits.numel() // 4]
    assert big and all(x.data_ptr() == logits.data_ptr() for x in big)
    with _Allocations([logits]) as bwd:
        torch.autograd.backward([logp, ent], [g_logp, g_ent])
    large = [(f, n) for f, n in bwd.sizes if n > full_bytes / 4]
    assert len(large) == 1 and large[0][1] == full_bytes, large  # the gradient itself


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=0.0, top_k=5, top_p=0.9),
        dict(temperature=torch.tensor([1.0, 1.0, 1.0]), top_k=5, top_p=0.9),
        dict(temperature=1.0, top_k=5, top_p=0.9, chunk_rows=0),
        dict(temperature=1.0, top_k=5, top_p=0.0),
    ],
)
def test_rejects_bad_arguments(kw):
    with pytest.raises(ValueError):
        truncated_logprobs_entropy(torch.randn(2, 3, 7), torch.zeros(2, 3, dtype=torch.long), **kw)


@pytest.mark.gpu
def test_cuda_triton_matches_float64_reference_and_torch_path(monkeypatch):
    """Compiled kernels on CUDA: vs the float64 reference where cuts sit on big masses
    (top-k 40 / top-p 0.95 of peaked logits), vs the CUDA torch path where they need not."""
    monkeypatch.delenv("BRORL_TRITON", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    g = torch.Generator(device="cuda").manual_seed(0)
    full = (torch.randn(3, 301, QWEN, generator=g, device="cuda") * 3).requires_grad_(True)
    ids = torch.randint(0, QWEN, (3, 300), generator=g, device="cuda")
    gl, gh = torch.randn(3, 300, device="cuda"), torch.randn(3, 300, device="cuda")
    s = dict(temperature=torch.tensor([0.7, 1.0, 1.3], device="cuda"),
             top_k=torch.tensor([40, -1, 40], device="cuda"),
             top_p=torch.tensor([0.95, 0.9, 1.0], device="cuda"))  # fmt: skip
    out = _run(truncated_logprobs_entropy, full, 300, ids, gl, gh, **s)
    monkeypatch.setenv("BRORL_TRITON", "0")
    chunked = _run(truncated_logprobs_entropy, full, 300, ids, gl, gh, **s)
    for a, b in zip(out, chunked):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    rows = [0, 2]  # top-k 40 rows: the float64 truth decides the same cuts
    sub = full.detach()[rows].double().requires_grad_(True)
    sub_s = {k: v[rows] for k, v in s.items()}
    want = _run(truncated_logprobs_entropy_reference, sub, 300, ids[rows], gl[rows].double(),
                gh[rows].double(), **sub_s)  # fmt: skip
    torch.testing.assert_close(out[0][rows], want[0].float(), **FWD)
    torch.testing.assert_close(out[1][rows], want[1].float(), **FWD)
    torch.testing.assert_close(out[2][rows], want[2].float(), **GRAD)


@pytest.mark.gpu
def test_cuda_peak_memory_vs_naive_truncation(monkeypatch):
    monkeypatch.delenv("BRORL_TRITON", raising=False)
    g = torch.Generator(device="cuda").manual_seed(1)
    full = (torch.randn(4, 512, QWEN, generator=g, device="cuda") * 3).requires_grad_(True)
    ids = torch.randint(0, QWEN, (4, 512), generator=g, device="cuda")
    gl, gh = torch.randn(4, 512, device="cuda"), torch.randn(4, 512, device="cuda")
    s = dict(temperature=torch.ones(4, device="cuda"), top_k=torch.full((4,), 40, device="cuda"),
             top_p=torch.full((4,), 0.95, device="cuda"))  # fmt: skip

    def peak(fn):
        full.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        logp, ent = fn(full, ids, **s)
        torch.autograd.backward([logp, ent], [gl, gh])
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    ours, naive = peak(truncated_logprobs_entropy), peak(truncated_logprobs_entropy_reference)
    assert ours <= 0.25 * naive
