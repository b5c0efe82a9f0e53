"""The DeepSpeed engine, and the only import of deepspeed: its JSON is built from the learner
config, never hand-edited.

On CPU the accelerator is selected with DS_ACCELERATOR=cpu before deepspeed is imported, and a
single learner process initialises a one-rank gloo group itself (no launcher needed); under
``torchrun``/``deepspeed`` the launcher's RANK/WORLD_SIZE are used instead.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


# Set beside RANK/WORLD_SIZE/... by a process that wrote them for its own one-rank group: a
# child started with a copy of its environment (a test's service, a launcher's) inherits them
# but was launched by no one, and must not take them for a launcher's (its rendezvous port may
# by then be any other socket's: EADDRINUSE).
OWN_RANK_ENV = "BRORL_OWN_RANK_ENV"


def launcher_world() -> int | None:
    """WORLD_SIZE as a launcher set it (torchrun, deepspeed, the learner's rank 0 for its
    children), or None when this process was not started as one rank of a group."""
    if "RANK" not in os.environ or OWN_RANK_ENV in os.environ:
        return None
    return int(os.environ.get("WORLD_SIZE", "1"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(timeout_s: float = 600.0) -> None:
    """Join the process group (one rank of its own without a launcher's RANK); collectives fail
    after ``timeout_s`` instead of waiting forever on a rank that died."""
    from datetime import timedelta

    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if launcher_world() is None:
        os.environ.update(
            {OWN_RANK_ENV: "1"},
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
        )
        if not dist.is_initialized():
            # One rank needs no rendezvous: an in-process store binds no port. A TCP store on
            # MASTER_PORT could find it taken (a free port, released, can be any outgoing
            # connection's local port before the store binds it: EADDRINUSE, seen in the suite);
            # DeepSpeed then adopts this process group.
            dist.init_process_group(
                backend, store=dist.HashStore(), rank=0, world_size=1,
                timeout=timedelta(seconds=timeout_s),
            )  # fmt: skip
    # joins the launcher's group, or adopts the one-rank group above (a no-op when it has)
    deepspeed.init_distributed(dist_backend=backend, timeout=timedelta(seconds=timeout_s))


def rank_and_world() -> tuple[int, int]:
    """This process's learner rank and the number of ranks (0, 1 without a process group)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def on_every_rank(flag: bool) -> bool:
    """True when ``flag`` holds on every rank (one all-reduce; no communication on one rank):
    every rank must take the same branch around a collective."""
    import torch
    import torch.distributed as dist

    if rank_and_world()[1] == 1:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def sum_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Each value summed over the ranks (the same keys, in the same order, on every rank)."""
    import torch
    import torch.distributed as dist

    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


def ds_config(train, zero_stage: int) -> dict:
    """DeepSpeed JSON from a brorl TrainConfig. Micro-batches are driven by the learner, which
    marks the accumulation boundary itself, so DeepSpeed sees one micro-batch per step."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": train.max_grad_norm,
        "zero_optimization": {"stage": zero_stage},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


# The optimizers that make the learner's gradient communication themselves (DeepSpeed's own
# all-reduce and clipping are off for them): brorl's 1-bit Adam on torch.distributed
# (onebit_adam.py); DeepSpeed's removed its own in deepspeedai/DeepSpeed#8490.
COMPRESSED = ("onebit_adam",)


def check_optimizer(train, zero_stage: int, cuda: bool = False, world: int | None = None) -> str:
    """Why ``train.optimizer`` cannot run on this learner ('' when it can). 1-bit Adam runs on
    CPU (gloo) and CUDA (NCCL) alike, so ``cuda`` does not matter; ``world``: the learner's
    ranks (default: this process's group, or its launcher's WORLD_SIZE)."""
    if train.optimizer not in COMPRESSED:
        return ""
    if zero_stage:
        return (
            f"1-bit Adam needs ZeRO stage 0 (stage {zero_stage} here): it exchanges the whole "
            "momentum and freezes the whole variance, which ZeRO's partitioned optimizer state "
            "does not hold; set zero_stage 0 or use optimizer adamw"
        )
    if world is None:
        world = learner_world()
    if world < 2:
        return (
            f"1-bit Adam needs 2 or more learner ranks ({world} here: there is nothing to "
            "compress); set ranks >= 2 or use optimizer adamw"
        )
    return ""


def learner_world() -> int:
    """The learner's ranks: the process group's size, else the launcher's WORLD_SIZE, else 1."""
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.get_world_size()
    return launcher_world() or 1


def build_engine(model, train, zero_stage: int = 0):
    """Wrap ``model`` in a DeepSpeed engine with its optimizer (AdamW, or 1-bit Adam, which
    then does the gradient communication and clipping itself); returns the engine."""
    import torch

    init_distributed()
    import deepspeed

    params = [p for p in model.parameters() if p.requires_grad]
    config = ds_config(train, zero_stage)
    betas = (0.9, 0.99)
    if train.optimizer in COMPRESSED:
        refused = check_optimizer(train, zero_stage)
        if refused:
            raise ValueError(refused)
        from services.learner.model.onebit_adam import OneBitAdam

        optimizer = OneBitAdam(
            params,
            lr=train.lr,
            betas=betas,
            weight_decay=train.weight_decay,
            warmup_steps=train.onebit_freeze_steps,
            max_grad_norm=train.max_grad_norm,
        )
        config["gradient_clipping"] = 0.0  # the optimizer clips: DeepSpeed would clip per rank
    else:
        # A client AdamW avoids JIT-compiling FusedAdam on CPU (about a minute on first use).
        optimizer = torch.optim.AdamW(
            params, lr=train.lr, weight_decay=train.weight_decay, betas=betas
        )
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    if train.optimizer in COMPRESSED:
        # the optimizer's exchange replaces DeepSpeed's gradient all-reduce (engine.backward /
        # engine.step skip allreduce_gradients without it)
        engine.enable_backward_allreduce = False
    log.info("DeepSpeed engine ready (ZeRO %d, %s)", zero_stage, type(engine.optimizer).__name__)
    return engine


def full_parameters(engine):
    """A context in which every rank holds the full parameters: ZeRO-3 gathers its partitions
    (a collective: every rank must enter); below stage 3 they are whole already."""
    import contextlib

    if engine.zero_optimization_stage() < 3:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None)


def grad_norm(engine) -> float:
    """L2 norm of the gradients about to be applied: call between backward and the boundary
    ``step``. Under ZeRO-2/3 the gradients live in optimizer partitions, so DeepSpeed's own
    figure for the step is used there (call after ``step``)."""
    import torch

    prepare = getattr(engine.optimizer, "prepare_gradients", None)
    if prepare is not None:  # 1-bit Adam: its exchange, clipping and norm (a collective)
        return prepare()
    grads = [
        p.grad.detach().float().norm() for p in engine.module.parameters() if p.grad is not None
    ]
    if grads:
        return float(torch.stack(grads).norm())
    return float(engine.get_global_grad_norm() or 0.0)


def discard_gradients(engine) -> None:
    """Drop accumulated gradients without an optimizer step (a skipped update)."""
    engine.optimizer.zero_grad(set_to_none=True)
    for p in engine.module.parameters():
        p.grad = None


def save_checkpoint(engine, directory: str, tag: str, client_state: dict) -> None:
    """DeepSpeed's checkpoint (at ZeRO 0 rank 0 writes the optimizer's shared state); 1-bit
    Adam's error buffers differ by rank, so every rank writes its own beside it."""
    engine.save_checkpoint(directory, tag=tag, client_state=client_state)
    rank_state = getattr(engine.optimizer, "rank_state", None)
    if rank_state is not None:
        import torch

        folder = os.path.join(directory, tag)
        os.makedirs(folder, exist_ok=True)
        torch.save(rank_state(), os.path.join(folder, _rank_file()))


def load_checkpoint(engine, directory: str, tag: str | None = None) -> dict:
    path, client_state = engine.load_checkpoint(directory, tag=tag)
    if path is None:
        raise FileNotFoundError(f"no DeepSpeed checkpoint in {directory}")
    load_rank_state = getattr(engine.optimizer, "load_rank_state", None)
    if load_rank_state is not None:
        import torch

        own = os.path.join(os.path.dirname(path), _rank_file())
        exists = os.path.exists(own)  # not when the checkpoint had fewer ranks
        load_rank_state(torch.load(own, map_location="cpu", weights_only=True) if exists else None)
    return client_state or {}


def _rank_file() -> str:
    return f"onebit_adam_rank{rank_and_world()[0]}.pt"
