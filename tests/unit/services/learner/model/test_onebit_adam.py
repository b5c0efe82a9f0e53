"""1-bit Adam (services/learner/model/onebit_adam.py) on R real gloo ranks (processes), on
parameters of irregular shapes (35 elements: not a multiple of 8, 2 or 3):

* the warm-up steps are torch's AdamW on the ranks' mean gradient, clipped by its norm;
* the compressed steps give the momentum, the worker and server errors and the weights of the
  one-process simulation (compressed_comm.exchange) — the collectives move the right bytes to
  the right rank — and the counting wrapper counts exactly what the messages hold;
* its state_dict + rank_state restore a compressed-phase optimizer that then steps identically;
* a non-finite gradient on one rank is seen on every rank, and a step on it is refused.

Mutations tried: ``compressed`` as ``self.t > self.warmup_steps`` (one extra fp32 step: the
simulated momentum and the byte counts differ); the all-to-all's rows not sent to their rank
(``out = rows.clone()``: the momentum differs); ``load_rank_state`` not restoring the server
error (the resumed step differs).
"""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from services.learner.model import compressed_comm as cc
from services.learner.model.deepspeed_engine import free_port

SHAPES = [(3, 5), (7,), (1,), (2, 2, 3)]  # n = 35
LR, WD, WARMUP, BLOCK, BETAS = 1e-2, 0.1, 2, 8, (0.9, 0.99)
DEVICE = ["cpu"]  # the rank processes' device: cuda under NCCL (test_onebit_adam_cuda.py)


def grads(rank: int, step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return [(torch.randn(s, generator=gen) * (1 + rank)).to(DEVICE[0]) for s in SHAPES]


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def make(params):
    from services.learner.model.onebit_adam import OneBitAdam

    return OneBitAdam(
        params,
        lr=LR,
        betas=BETAS,
        weight_decay=WD,
        warmup_steps=WARMUP,
        max_grad_norm=1.0,
        block=BLOCK,
    )


def set_grads(params, rank: int, step: int) -> None:
    for p, g in zip(params, grads(rank, step)):
        p.grad = g.clone()


def warmup_equals_adamw(opt, params, rank, world) -> list[int]:
    ref = [p.detach().clone().requires_grad_() for p in params]
    adamw = torch.optim.AdamW(ref, lr=LR, betas=BETAS, weight_decay=WD)
    sent = []
    for step in range(WARMUP):
        set_grads(params, rank, step)
        for i, r in enumerate(ref):  # the mean over ranks, clipped as DeepSpeed clips it
            r.grad = torch.stack([grads(k, step)[i] for k in range(world)]).mean(dim=0)
        torch.nn.utils.clip_grad_norm_(ref, 1.0)
        before = opt.comm.total
        opt.step()
        adamw.step()
        sent.append(opt.comm.total - before)
        assert (flat(params) - flat(ref)).abs().max() <= 1e-6
    return sent


def compressed_equals_simulation(opt, params, rank, world) -> list[int]:
    n, size = 35, cc.slice_size(35, world, BLOCK)
    worker = torch.zeros(world, world * size, device=DEVICE[0])
    server = torch.zeros(world, size, device=DEVICE[0])
    root = (1 - BETAS[1] ** WARMUP) ** 0.5
    frozen = (opt.exp_avg_sq.sqrt() / root).add_(1e-8)  # (n,)
    m, w, sent = opt.exp_avg.clone(), flat(params), []
    for step in range(WARMUP, WARMUP + 3):
        gs = [flat(grads(k, step)) for k in range(world)]  # (n,) per rank
        norm = torch.stack(
            [
                torch.stack([t.norm() for t in grads(k, step)]).pow(2).sum().sqrt()
                for k in range(world)
            ]
        ).mean()
        coef = min(1.0, 1.0 / (float(norm) + 1e-6))
        xs = [(m * BETAS[0] + g * coef * (1 - BETAS[0])) / frozen for g in gs]
        out, worker, server = cc.exchange(xs, worker, server, BLOCK)
        m = out * frozen
        t = step + 1
        w = w * (1 - LR * WD) - LR / (1 - BETAS[0] ** t) * out
        set_grads(params, rank, step)
        before = opt.comm.total
        opt.step()
        sent.append(opt.comm.total - before)
        assert (opt.exp_avg - m).abs().max() <= 1e-5
        assert (opt.worker_error - worker[rank]).abs().max() <= 1e-5
        assert (opt.server_error - server[rank]).abs().max() <= 1e-5
        assert (flat(params) - w).abs().max() <= 1e-6
        assert n < opt.worker_error.numel()  # padded
    return sent


def resumes_exactly(opt, params, rank) -> None:
    copy = [p.detach().clone().requires_grad_() for p in params]
    resumed = make(copy)
    resumed.load_state_dict(opt.state_dict())
    resumed.load_rank_state(opt.rank_state())
    for o, ps in ((opt, params), (resumed, copy)):
        set_grads(ps, rank, 99)
        o.step()
    assert torch.equal(flat(params), flat(copy))


def refuses_non_finite(opt, params, rank) -> None:
    set_grads(params, rank, 7)
    if rank == 1:
        params[1].grad[3] = float("nan")
    assert not math.isfinite(opt.prepare_gradients())  # on every rank
    with pytest.raises(FloatingPointError, match="non-finite step must be skipped"):
        opt.step()
    opt.zero_grad()


def scenario(rank: int, world: int) -> dict:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s).to(DEVICE[0])) for s in SHAPES]
    opt = make(params)
    warm = warmup_equals_adamw(opt, params, rank, world)
    assert opt.compressed
    comp = compressed_equals_simulation(opt, params, rank, world)
    resumes_exactly(opt, params, rank)
    refuses_non_finite(opt, params, rank)
    return {"warm": warm, "compressed": comp}


def _rank(rank: int, world: int, port: int, out: str, device: str = "cpu") -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    DEVICE[0] = device
    if device == "cuda":
        torch.cuda.set_device(rank)
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        torch.save(scenario(rank, world), os.path.join(out, f"rank{rank}.pt"))
        # every rank past its last collective before any tears down: without it a rank
        # aborted in gloo's teardown ("terminate called without an active exception") in 4
        # of 12 runs on one VM, 0 of 10 with it (the learner's ranks end on a broadcast too)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ranks(tmp_path, world: int, device: str = "cpu") -> None:
    """R rank processes through ``scenario``; then what each sent, checked."""
    mp.spawn(_rank, args=(world, free_port(), str(tmp_path), device), nprocs=world)
    size = cc.slice_size(35, world, BLOCK)
    message = cc.message_bytes(size, BLOCK)
    for rank in range(world):
        sent = torch.load(tmp_path / f"rank{rank}.pt")
        # fp32 all-reduce as a ring sends it: 2 (R - 1) / R of 35 floats
        assert sent["warm"] == [2 * (world - 1) * 35 * 4 // world] * WARMUP
        # the norm's float, then R - 1 messages out in the all-to-all and in the all-gather
        norm = 2 * (world - 1) * 4 // world
        assert sent["compressed"] == [norm + 2 * (world - 1) * message] * 3


# each rank is a process (about 5-10 s of start-up here): 3 ranks only in the slow suite
@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_onebit_adam_on_gloo_ranks(tmp_path, world):
    run_ranks(tmp_path, world)


def test_one_rank_is_refused():
    from services.learner.model.onebit_adam import OneBitAdam

    class OneRank:
        rank, world = 0, 1

    with pytest.raises(ValueError, match="needs 2 or more ranks"):
        OneBitAdam([torch.nn.Parameter(torch.zeros(3))], lr=1e-3, comm=OneRank())


def test_a_checkpoint_of_another_number_of_ranks_starts_the_errors_at_zero():
    from services.learner.model.onebit_adam import OneBitAdam

    def ranks(world: int):
        comm = type("Comm", (), {"rank": 0, "world": world})()
        params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
        return OneBitAdam(params, lr=LR, warmup_steps=1, block=BLOCK, comm=comm)

    saved = ranks(2)
    saved.t = 3  # in the compressed phase, with error buffers
    saved._errors()[0].fill_(0.5)
    state, rank_state = saved.state_dict(), saved.rank_state()
    same = ranks(2)
    same.load_state_dict(state)
    same.load_rank_state(rank_state)
    assert same.t == 3 and torch.equal(same.worker_error, saved.worker_error)
    with pytest.raises(FileNotFoundError, match="the checkpoint is partial"):
        same.load_rank_state(None)  # a rank of the same layout wrote none
    more = ranks(3)
    more.load_state_dict(state)
    more.load_rank_state(None)  # rank 2 of 3: none written
    more.load_rank_state(rank_state)  # rank 0 of 3: another slice layout
    assert more.worker_error is None and more.t == 3
