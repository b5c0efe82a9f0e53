"""PPO's critic: a separate value model (the policy's initial trunk and a scalar head) in its own
DeepSpeed engine, so it shares the policy's ranks and ZeRO stage but not its optimizer.

V(prompt + completion tokens < t) is read at the positions that predict completion token t
(forward.completion_states: the prompt runs once per chunk, or once a group where the policy
shares it: prompt_once.py, through ``trunk``). The head starts at zero, so the first values are 0
and the first advantages are the plain discounted returns.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from services.learner.model import deepspeed_engine, pretrained
from services.learner.algo import ppo
from services.learner.model.batch import Batch
from services.learner.model.forward import PromptPass, completion_states


class ValueModel(nn.Module):
    """A causal-LM trunk (no LM head) and a linear head: (b, C) values of a chunk."""

    def __init__(self, trunk: nn.Module, hidden: int):
        super().__init__()
        self.trunk = trunk
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, batch: Batch, prompt: PromptPass | None = None) -> torch.Tensor:
        states = completion_states(self.trunk, batch, prompt)  # (b, C, H)
        return self.head(states.float()).squeeze(-1)  # (b, C)


class Critic:
    def __init__(self, model_dir: str, train, zero_stage: int = 0):
        trunk = pretrained.trunk(model_dir)
        model = ValueModel(trunk, trunk.config.hidden_size)
        lr = train.ppo.value_lr or train.lr
        # The critic always uses AdamW: a compressed optimizer is the policy's choice.
        value_train = train.model_copy(update={"lr": lr, "optimizer": "adamw"})
        self.engine = deepspeed_engine.build_engine(model, value_train, zero_stage)
        self.clip = train.ppo.value_clip

    @property
    def trunk(self) -> nn.Module:
        """The value model's trunk, whose prompt pass a group's chunks may share."""
        return self.engine.module.trunk

    def values(self, chunk: Batch, prompt: PromptPass | None = None) -> torch.Tensor:
        """(b, C) values under the current critic (with autograd when enabled); ``prompt``: the
        chunk's group's prompt already run through ``trunk``, else the chunk runs it."""
        return self.engine(chunk, prompt)

    def loss(
        self, chunk: Batch, prompt: PromptPass | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped value loss of ``chunk`` (token mean) and its statistics."""
        self.engine.train()
        values = self.values(chunk, prompt)  # (b, C)
        loss, stats = ppo.value_loss(
            values, chunk.old_values, chunk.returns, chunk.loss_mask, self.clip
        )
        return loss, {"value_loss": float(loss.detach()), **stats}

    def backward(self, loss: torch.Tensor, scale: float, last: bool, surrogate=0.0) -> None:
        """Accumulate ``loss × scale`` (plus a shared prompt's ``surrogate``, unscaled:
        prompt_once.py); the critic's optimizer steps at the boundary (``last``)."""
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss * scale + surrogate)
        self.engine.step()

    def save_checkpoint(self, directory: str, tag: str) -> None:
        deepspeed_engine.save_checkpoint(self.engine, os.path.join(directory, "critic"), tag, {})

    def load_checkpoint(self, directory: str, tag: str | None = None) -> None:
        deepspeed_engine.load_checkpoint(self.engine, os.path.join(directory, "critic"), tag)
