"""The pure pieces of 1-bit Adam's exchange (services/learner/model/compressed_comm.py) against
their float64 twins, on irregular sizes: not a multiple of 8 or of R, size 1, all-zero inputs,
padding, NaN refused; and error feedback, whose running mean converges to the true mean.

Mutations tried, each failing test_error_feedback_running_mean_converges_to_the_true_mean:
the worker's new error replaced by zeros in ``worker_messages`` (no worker-side feedback: the
running mean stays 1.8 off); the server's new error replaced by zeros in ``serve`` (no
server-side buffer: 0.69 off); and in ``compress``, ``new_error = y - ...`` replaced by
``x - ...`` (the error not carried: fails the twin tests too)."""

from __future__ import annotations

import pytest
import torch

from services.learner.model import compressed_comm as cc

SIZES = [1, 7, 8, 9, 37, 100, 257]


@pytest.mark.parametrize("n", SIZES)
def test_signs_pack_8_per_byte_and_unpack(n):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))  # (n,)
    x[:: max(1, n // 3)] = 0.0  # zeros count as +
    packed = cc.pack_signs(x)  # (ceil(n/8),)
    assert packed.dtype == torch.uint8 and packed.numel() == -(-n // 8)
    assert packed.tolist() == cc.pack_signs_reference(x.tolist())
    signs = cc.unpack_signs(packed, n)  # (n,)
    assert torch.equal(signs, torch.where(x >= 0, 1.0, -1.0))


@pytest.mark.parametrize("n,block,valid", [(1, 8, 1), (13, 8, 13), (37, 16, 30), (100, 24, 0)])
def test_compress_matches_its_twin_and_keeps_the_rest_as_error(n, block, valid):
    gen = torch.Generator().manual_seed(n + block)
    x = torch.randn(n, generator=gen, dtype=torch.float64)  # (n,)
    x[valid:] = 0.0  # padding is zero
    error = torch.randn(n, generator=gen, dtype=torch.float64) * 0.1
    error[valid:] = 0.0
    packed, scales, new_error = cc.compress(x, error, block, valid)
    sent = cc.decompress(packed, scales, n, block)  # (n,)
    want, want_error = cc.compress_reference(x.tolist(), error.tolist(), block, valid)
    assert torch.allclose(sent, torch.tensor(want, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(new_error, torch.tensor(want_error, dtype=torch.float64), atol=1e-12)
    # what is not sent is kept: sent + error = x + old error on the real elements
    assert torch.allclose((sent + new_error)[:valid], (x + error)[:valid], atol=1e-12)
    assert not new_error[valid:].any()  # padding keeps no error
    assert scales.numel() == -(-n // block)


def test_all_zero_tensors_send_zero_and_keep_no_error():
    packed, scales, new_error = cc.compress(torch.zeros(19), torch.zeros(19), 8)
    assert not scales.any() and not new_error.any()
    assert not cc.decompress(packed, scales, 19, 8).any()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_values_are_refused(bad):
    x = torch.ones(11)
    x[4] = bad
    with pytest.raises(ValueError, match="1 of 11 values are NaN or inf"):
        cc.compress(x, torch.zeros(11), 8)


def test_a_block_that_is_no_multiple_of_8_is_refused():
    with pytest.raises(ValueError, match="block must be a positive multiple of 8"):
        cc.slice_size(10, 2, 12)


@pytest.mark.parametrize(
    "world,n,block", [(1, 1, 8), (2, 1, 8), (2, 13, 8), (3, 37, 16), (5, 100, 8)]
)
def test_the_exchange_matches_its_twin_over_steps(world, n, block):
    """R ranks, n not a multiple of 8 or R: three chained steps, errors carried."""
    size = cc.slice_size(n, world, block)
    assert size % block == 0 and world * size >= n
    gen = torch.Generator().manual_seed(world * 100 + n)
    worker = torch.zeros(world, world * size, dtype=torch.float64)  # (R, N)
    server = torch.zeros(world, size, dtype=torch.float64)  # (R, S)
    ref_w, ref_s = worker.tolist(), server.tolist()
    for _ in range(3):
        xs = [torch.randn(n, generator=gen, dtype=torch.float64) for _ in range(world)]
        out, worker, server = cc.exchange(xs, worker, server, block)  # (n,)
        want, ref_w, ref_s = cc.exchange_reference([x.tolist() for x in xs], ref_w, ref_s, block)
        assert out.shape == (n,)
        # messages carry fp32 scales: the twin's float64 agrees to fp32 rounding
        assert torch.allclose(out, torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=1e-6)
        assert torch.allclose(worker, torch.tensor(ref_w, dtype=torch.float64), atol=1e-5)
        assert torch.allclose(server, torch.tensor(ref_s, dtype=torch.float64), atol=1e-5)
        assert not worker[:, n:].any()  # the padding keeps no error


def test_error_feedback_running_mean_converges_to_the_true_mean():
    """A fixed set of per-rank vectors exchanged K times: the running mean of what arrives
    tends to their true mean (the error buffers give back what each step could not send)."""
    world, n, block = 3, 37, 8
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(n, generator=gen) * (1 + i) for i in range(world)]  # (n,) each
    true = torch.stack(xs).mean(dim=0)  # (n,)
    size = cc.slice_size(n, world, block)
    worker, server = torch.zeros(world, world * size), torch.zeros(world, size)
    total, gaps = torch.zeros(n), {}
    for k in range(1, 401):
        out, worker, server = cc.exchange(xs, worker, server, block)
        total += out
        if k in (40, 400):
            gaps[k] = float((total / k - true).abs().max())
    scale = float(true.abs().max())
    assert gaps[400] < 0.05 * scale, gaps  # one step alone is off by ~0.7 × scale
    assert gaps[400] < gaps[40] / 4, gaps  # and the gap shrinks about as 1/K
