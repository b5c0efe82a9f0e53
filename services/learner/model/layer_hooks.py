"""A callback between a model's layers, in the forward and in the backward.

The learner borrows the rollout workers' cores while they have nothing to sample
(services/learner/cores.py) and asks whether they do before each chunk of its update. A chunk of
the long shape (32 paths of ~190 tokens through a 24 M model) takes ~2 s, so a worker that ran
out of work just after a chunk began left its core idle for up to that long: the learner
borrowed 0.07-0.13 s a step while the worker idled ~0.9 s a group, against 0.8-0.9 s a step
with this (docs/performance.md). Called between layers, the check comes every ~0.1 s of the
update instead.

The forward calls it before each decoder layer (a forward pre-hook); the backward calls it as
each layer's output gradient is computed (a hook on that output tensor, registered during the
forward; the CPU backward runs on the thread that called ``backward``, so ``torch.set_num_threads``
in the callback applies to the update's own thread pool). Either hook only calls: what the
callback does, and how often it really checks, is its own (``CoreBorrowing.refresh`` reads the
backlog at most every 50 ms).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle


def decoder_layers(model: nn.Module) -> nn.ModuleList | None:
    """The model's stack of layers: its longest ``ModuleList`` (``model.layers`` of Llama and
    Qwen, ``transformer.h`` of GPT-2), None for a model without one."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    return max(lists, key=len, default=None)


def call_between_layers(model: nn.Module, callback: Callable[[], None]) -> list[RemovableHandle]:
    """Call ``callback`` before each layer's forward and after each layer's output gradient in
    the backward; returns the hooks' handles (``handle.remove()`` takes one out). A model with no
    layer stack gets no hooks."""
    layers = decoder_layers(model)
    if layers is None:
        return []

    def on_gradient(grad: torch.Tensor) -> None:
        callback()  # returns None: the gradient goes on unchanged

    def before(module: nn.Module, args) -> None:
        callback()

    def after(module: nn.Module, args, output) -> None:
        hidden = output[0] if isinstance(output, (tuple, list)) else output
        if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
            hidden.register_hook(on_gradient)

    handles = []
    for layer in layers:
        handles.append(layer.register_forward_pre_hook(before))
        handles.append(layer.register_forward_hook(after))
    return handles


@contextmanager
def between_layers(model: nn.Module | None, callback: Callable[[], None]) -> Iterator[None]:
    """``call_between_layers`` for the duration of the block (None: no model, no hooks): the
    learner's update, so that a forward outside it (the warm-up, the probes) calls nothing."""
    handles = call_between_layers(model, callback) if model is not None else []
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
