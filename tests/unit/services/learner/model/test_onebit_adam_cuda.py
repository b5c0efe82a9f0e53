"""1-bit Adam on CUDA (skipped without it). With 2 or more GPUs: the whole scenario of
test_onebit_adam.py on 2 NCCL ranks (warm-up = AdamW, compressed steps = the one-process
simulation, bytes counted, checkpoint round trip, a NaN on one rank seen by both). With one
GPU (NCCL takes one GPU per rank): the pure pieces on CUDA tensors give the CPU's results.

Run on a GPU machine: ``python -m pytest -m gpu tests/unit/services/learner/model -q``.
"""

from __future__ import annotations

import pytest
import torch

from services.learner.model import compressed_comm as cc

pytestmark = pytest.mark.gpu


def test_onebit_adam_on_two_nccl_ranks(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("NCCL needs one GPU per rank: 2 ranks need 2 GPUs")
    from tests.unit.services.learner.model.test_onebit_adam import run_ranks

    run_ranks(tmp_path, 2, "cuda")


@pytest.mark.parametrize("world,n,block", [(2, 37, 8), (3, 1000, 256), (4, 1, 8)])
def test_the_exchange_on_cuda_tensors_gives_the_cpu_result(world, n, block):
    gen = torch.Generator().manual_seed(n)
    size = cc.slice_size(n, world, block)
    state = {
        d: (torch.zeros(world, world * size, device=d), torch.zeros(world, size, device=d))
        for d in ("cpu", "cuda")
    }
    for _ in range(3):  # errors carried from step to step
        xs = [torch.randn(n, generator=gen) for _ in range(world)]  # (n,) per rank
        outs = {}
        for d, (worker, server) in state.items():
            outs[d], worker, server = cc.exchange([x.to(d) for x in xs], worker, server, block)
            state[d] = (worker, server)
        assert torch.allclose(outs["cuda"].cpu(), outs["cpu"], atol=1e-5, rtol=1e-5)
        for a, b in zip(state["cuda"], state["cpu"]):
            assert torch.allclose(a.cpu(), b, atol=1e-5, rtol=1e-5)
    packed = cc.pack_signs(xs[0].cuda())
    assert torch.equal(packed.cpu(), cc.pack_signs(xs[0]))
    assert torch.equal(cc.unpack_signs(packed, n).cpu(), cc.unpack_signs(packed.cpu(), n))
