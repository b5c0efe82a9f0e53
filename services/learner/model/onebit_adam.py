"""1-bit Adam (Tang et al., 2021) on torch.distributed: gloo on CPU, NCCL on CUDA. DeepSpeed
removed its own (deepspeedai/DeepSpeed#8490); this one runs inside brorl's learner ranks at ZeRO
stage 0 (docs/scaling.md).

* Warm-up (``warmup_steps`` steps): exact AdamW (torch's arithmetic, bias corrections
  included) on the gradients averaged by an fp32 all-reduce, clipped by their global norm.
* Compressed phase: the variance is frozen. Each rank folds its own (clipped) gradient into the
  shared momentum, m_i = β1 m + (1 − β1) g_i, and the ranks exchange m_i as signs plus one scale
  per block with error feedback on the worker and on the server side (compressed_comm.py): an
  all-to-all of 1-bit slices, each rank serving one slice, then an all-gather of the served
  slices. Every rank ends with the same m, and the update is m / sqrt(frozen v).

The optimizer does all of the gradient communication: DeepSpeed's own all-reduce and clipping are
off for it (deepspeed_engine.build_engine). Clipping: the warm-up clips the averaged gradient by
its norm, as DeepSpeed does for AdamW; the compressed phase never sees the averaged gradient, so
each rank's gradient is clipped by the mean of the ranks' gradient norms (one float all-reduced;
an upper bound of the averaged gradient's norm, as DeepSpeed's clip computes it for un-averaged
gradients). Elements whose frozen variance is exactly 0 (no gradient in the whole warm-up) are
held still: sign compression cannot send a 0, and 1 / sqrt(0) would blow it up.

``CountingComm`` makes every collective and counts the bytes this rank sends (what ``bench/
onebit_adam.py`` and the tests read). Shapes: n parameters (flat), N = R × S padded, S a slice.
"""

from __future__ import annotations

import logging
import math
from collections import Counter

import torch
import torch.distributed as dist

from services.learner.model import compressed_comm as cc

log = logging.getLogger(__name__)

BLOCK = 256  # elements per scale: 1/8 + 4/256 bytes an element, 1/28 of fp32's all-reduce


def _norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm over tensors as DeepSpeed's clip_grad_norm_ takes it (per tensor, then all)."""
    return torch.stack([g.norm(2) for g in grads]).pow(2).sum().pow(0.5)


class CountingComm:
    """The collectives 1-bit Adam makes (default process group), with ``sent[name]``: bytes this
    rank sent. all_reduce is counted as a ring sends it, 2 (R − 1) / R of the tensor; the
    all-to-all sends R − 1 of its R rows, the all-gather R − 1 copies of this rank's part."""

    def __init__(self):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.sent: Counter = Counter()

    @property
    def total(self) -> int:
        return sum(self.sent.values())

    def all_reduce_mean(self, t: torch.Tensor) -> torch.Tensor:
        t.mul_(1.0 / self.world)  # before the sum, as DeepSpeed averages gradients
        dist.all_reduce(t)
        self.sent["all_reduce"] += 2 * (self.world - 1) * t.numel() * t.element_size() // self.world
        return t

    def all_to_all(self, rows: torch.Tensor) -> torch.Tensor:
        """(R, m): row j goes to rank j; row i of the result came from rank i."""
        out = torch.empty_like(rows)
        dist.all_to_all_single(out, rows.contiguous())
        self.sent["all_to_all"] += (self.world - 1) * rows[0].numel() * rows.element_size()
        return out

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """(m,) → (R, m): every rank's ``t``."""
        out = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(out, t.contiguous())
        self.sent["all_gather"] += (self.world - 1) * t.numel() * t.element_size()
        return torch.stack(out)


def compressed_allreduce(
    comm: CountingComm,
    x: torch.Tensor,
    worker_error: torch.Tensor,
    server_error: torch.Tensor,
    block: int,
    valid: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The mean of every rank's x (N,) through 1-bit messages (compressed_comm.exchange, over
    the process group): → ((N,) the same on every rank, new worker error (N,), new server error
    (S,)); ``valid``: the real elements of x (the rest is padding)."""
    size = server_error.numel()
    rows, worker_error = cc.worker_messages(x, worker_error, comm.world, block, valid)
    inbox = comm.all_to_all(rows)  # (R, message): this rank's slice from every worker
    served = cc.slice_valid(valid, comm.rank, size)
    message, server_error = cc.serve(inbox, server_error, block, served)
    out = cc.assemble(comm.all_gather(message), size, block)
    return out, worker_error, server_error


class OneBitAdam(torch.optim.Optimizer):
    def __init__(
        self,
        params,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.99),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        warmup_steps: int = 100,
        max_grad_norm: float = 0.0,
        block: int = BLOCK,
        comm: CountingComm | None = None,
    ):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        if len(self.param_groups) != 1:
            raise ValueError("1-bit Adam takes one parameter group (one flat momentum)")
        self.params = list(self.param_groups[0]["params"])
        self.comm = comm or CountingComm()
        if self.comm.world < 2:
            raise ValueError("1-bit Adam needs 2 or more ranks: with one there is nothing to send")
        self.warmup_steps, self.max_grad_norm, self.block = warmup_steps, max_grad_norm, block
        self.n = sum(p.numel() for p in self.params)
        self.size = cc.slice_size(self.n, self.comm.world, block)
        self.t = 0  # optimizer steps taken
        self.exp_avg = self.exp_avg_sq = None  # (n,) fp32, made on the parameters' device
        self.worker_error = self.server_error = None  # (N,), (S,): from the first compressed step
        self._frozen = self._still = None  # (n,) sqrt(v) + eps and v == 0, once v is frozen
        self._saved_world = self.comm.world  # the ranks of the loaded checkpoint
        self._grad: torch.Tensor | None = None  # (n,) this step's prepared gradient
        self._norm = 0.0

    @property
    def compressed(self) -> bool:
        """Whether the next step exchanges 1-bit momentum (the warm-up is over)."""
        return self.t >= self.warmup_steps

    def _moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.exp_avg is None:
            device = self.params[0].device
            self.exp_avg = torch.zeros(self.n, dtype=torch.float32, device=device)
            self.exp_avg_sq = torch.zeros_like(self.exp_avg)
        return self.exp_avg, self.exp_avg_sq

    def _errors(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.worker_error is None:
            m = self._moments()[0]
            self.worker_error = m.new_zeros(self.comm.world * self.size)
            self.server_error = m.new_zeros(self.size)
        return self.worker_error, self.server_error

    @torch.no_grad()
    def prepare_gradients(self) -> float:
        """This step's gradient (a collective: every rank calls it after its last backward):
        warm-up, the fp32 mean over ranks clipped by its norm; compressed, this rank's own
        gradient clipped by the mean of the ranks' norms. Returns that norm (NaN/inf on every
        rank alike when any rank's gradient is not finite)."""
        m = self._moments()[0]
        grads = [
            p.grad.reshape(-1).float() if p.grad is not None else m.new_zeros(p.numel())
            for p in self.params
        ]
        g = torch.cat(grads)  # (n,)
        if self.compressed:
            norm = self.comm.all_reduce_mean(_norm(self._views(g)).reshape(1))[0]
        else:
            norm = _norm(self._views(self.comm.all_reduce_mean(g)))
        if self.max_grad_norm > 0:  # DeepSpeed's clip: the same arithmetic as for AdamW
            g.mul_(torch.clamp(self.max_grad_norm / (norm + 1e-6), max=1.0))
        self._grad, self._norm = g, float(norm)
        return self._norm

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's part of a flat (n,) tensor, shaped like it."""
        out, offset = [], 0
        for p in self.params:
            out.append(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        self._grad = None

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("1-bit Adam takes no closure")
        if self._grad is None:
            self.prepare_gradients()
        g, self._grad = self._grad, None
        if not math.isfinite(self._norm):
            raise FloatingPointError(
                f"1-bit Adam: gradient norm {self._norm}; a non-finite step must be skipped"
            )
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        exp_avg, exp_avg_sq = self._moments()
        self.t += 1
        warm = self.t <= self.warmup_steps
        root = (1 - beta2 ** min(self.t, self.warmup_steps)) ** 0.5  # frozen with the variance
        denoms = None
        if not warm:
            if self._frozen is None:  # sqrt(v) + eps, and where v is 0: fixed from here on
                self._frozen = (exp_avg_sq.sqrt() / root).add_(group["eps"])  # (n,)
                self._still = exp_avg_sq == 0  # (n,)
            self._exchange_momentum(g, beta1)
            denoms = self._views(self._frozen)
        step_size = group["lr"] / (1 - beta1**self.t)
        decay = 1 - group["lr"] * group["weight_decay"]
        # parameter by parameter, torch's AdamW arithmetic op for op (the warm-up equals it)
        views = zip(self.params, self._views(g), self._views(exp_avg), self._views(exp_avg_sq))
        for i, (p, grad, m, v) in enumerate(views):
            if group["weight_decay"]:
                p.mul_(decay)
            if warm:
                m.lerp_(grad, 1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (v.sqrt() / root).add_(group["eps"]) if warm else denoms[i]
            p.addcdiv_(m, denom, value=-step_size)
        return None

    def _exchange_momentum(self, g: torch.Tensor, beta1: float) -> None:
        """m ← the ranks' mean of β1 m + (1 − β1) g_i, sent in 1 bit an element. It travels in
        the units of the update, m / (sqrt(v) + eps) (the same on every rank and every step):
        one scale per block then fits small- and large-gradient elements alike. Elements whose
        frozen variance is 0 are held at 0."""
        exp_avg, frozen, still = self.exp_avg, self._frozen, self._still
        worker_error, server_error = self._errors()
        x = exp_avg.new_zeros(worker_error.numel())  # (N,) padded
        x[: self.n].copy_(g).mul_(1 - beta1).add_(exp_avg, alpha=beta1).div_(frozen)
        x[: self.n].masked_fill_(still, 0.0)
        out, self.worker_error, self.server_error = compressed_allreduce(
            self.comm, x, worker_error, server_error, self.block, self.n
        )
        exp_avg.copy_(out[: self.n]).mul_(frozen).masked_fill_(still, 0.0)

    # ---- checkpoints: the shared state in state_dict, each rank's errors in rank_state ------

    def state_dict(self) -> dict:
        exp_avg, exp_avg_sq = self._moments()
        out = super().state_dict()
        out["onebit"] = {
            "step": self.t,
            "warmup_steps": self.warmup_steps,
            "n": self.n,
            "world": self.comm.world,
            "exp_avg": exp_avg.detach().cpu().clone(),
            "exp_avg_sq": exp_avg_sq.detach().cpu().clone(),
        }
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        own = state_dict.pop("onebit", None)
        if own is None:
            raise ValueError("not a 1-bit Adam state (no 'onebit' entry): resume with adamw")
        if own["n"] != self.n:
            raise ValueError(f"1-bit Adam state of {own['n']} parameters, this model has {self.n}")
        super().load_state_dict(state_dict)
        exp_avg, exp_avg_sq = self._moments()
        exp_avg.copy_(own["exp_avg"])
        exp_avg_sq.copy_(own["exp_avg_sq"])
        self.t = int(own["step"])
        self._saved_world = int(own.get("world", self.comm.world))
        self.worker_error = self.server_error = None  # this rank's come from load_rank_state
        self._frozen = self._still = None

    def rank_state(self) -> dict:
        """This rank's error buffers (they differ by rank: each rank serves its own slice)."""
        worker_error, server_error = self._errors() if self.t > self.warmup_steps else (None, None)
        cpu = lambda t: None if t is None else t.detach().cpu().clone()  # noqa: E731
        return {
            "step": self.t,
            "rank": self.comm.rank,
            "world": self.comm.world,
            "block": self.block,
            "worker_error": cpu(worker_error),
            "server_error": cpu(server_error),
        }

    def load_rank_state(self, state: dict | None) -> None:
        """This rank's errors from ``rank_state`` (after ``load_state_dict``). None: this rank
        wrote none, which only a checkpoint of another number of ranks may lack. With another
        layout of ranks (or block) the errors start at 0."""
        if state is None:
            if self._saved_world == self.comm.world and self.t > self.warmup_steps:
                raise FileNotFoundError(
                    f"1-bit Adam: no error buffers of rank {self.comm.rank} in a checkpoint of "
                    f"{self._saved_world} ranks at step {self.t}: the checkpoint is partial"
                )
            state = {"step": self.t, "worker_error": None}
        if int(state["step"]) != self.t:
            raise ValueError(
                f"1-bit Adam rank state of step {state['step']} beside optimizer state of "
                f"step {self.t}: the checkpoint's files do not belong together"
            )
        layout = (state.get("rank"), state.get("world"), state.get("block"))
        same = layout == (self.comm.rank, self.comm.world, self.block)
        if state["worker_error"] is None or not same:
            if self.t > self.warmup_steps:
                log.warning("1-bit Adam: checkpoint of another rank layout; errors start at 0")
            self.worker_error = self.server_error = None
            return
        worker_error, server_error = self._errors()
        worker_error.copy_(state["worker_error"])
        server_error.copy_(state["server_error"])
