"""PPO's critic: a separate value model (the policy's initial trunk and a scalar head) in its own
DeepSpeed engine, so it shares the policy's ranks and ZeRO stage but not its optimizer.

V(prompt + completion tokens < t) is read at the positions that predict completion token t
(forward.completion_states: the prompt runs once per chunk). The head starts at zero, so the
first values are 0 and the first advantages are the plain discounted returns.
"""

from __future__ import annotations

import dataclasses
import os

import torch
from torch import nn

from services.learner.model import deepspeed_engine
from services.learner.algo import ppo
from services.learner.model.batch import Batch
from services.learner.model.forward import completion_states


class ValueModel(nn.Module):
    """A causal-LM trunk (no LM head) and a linear head: (b, C) values of a chunk."""

    def __init__(self, trunk: nn.Module, hidden: int):
        super().__init__()
        self.trunk = trunk
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, batch: Batch) -> torch.Tensor:
        states = completion_states(self.trunk, batch)  # (b, C, H)
        return self.head(states.float()).squeeze(-1)  # (b, C)


class Critic:
    def __init__(self, model_dir: str, train, zero_stage: int = 0):
        from transformers import AutoModel

        attention = "sdpa" if torch.cuda.is_available() else "eager"
        trunk = AutoModel.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation=attention
        )
        model = ValueModel(trunk, trunk.config.hidden_size)
        lr = train.ppo.value_lr or train.lr
        # The critic always uses AdamW: a compressed optimizer is the policy's choice.
        value_train = train.model_copy(update={"lr": lr, "optimizer": "adamw"})
        self.engine = deepspeed_engine.build_engine(model, value_train, zero_stage)
        self.clip = train.ppo.value_clip

    def values(self, chunk: Batch) -> torch.Tensor:
        """(b, C) values under the current critic (with autograd when enabled)."""
        return self.engine(chunk)

    def prepare(self, chunks: list[Batch], rewards: list[torch.Tensor], train, device, kl=None):
        """The step's chunks with GAE advantages, returns and the critic's values now, and the
        statistics measured before the update (token_advantages)."""
        self.engine.eval()
        cfg = train.ppo
        return token_advantages(
            chunks, rewards, device, cfg.gamma, cfg.lam, cfg.whiten, self.values, kl, train.kl_coef
        )

    def loss(self, chunk: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped value loss of ``chunk`` (token mean) and its statistics."""
        self.engine.train()
        values = self.values(chunk)  # (b, C)
        loss, stats = ppo.value_loss(
            values, chunk.old_values, chunk.returns, chunk.loss_mask, self.clip
        )
        return loss, {"value_loss": float(loss.detach()), **stats}

    def backward(self, loss: torch.Tensor, scale: float, last: bool) -> None:
        """Accumulate ``loss × scale``; the critic's optimizer steps at the boundary (``last``)."""
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss * scale)
        self.engine.step()

    def save_checkpoint(self, directory: str, tag: str) -> None:
        deepspeed_engine.save_checkpoint(self.engine, os.path.join(directory, "critic"), tag, {})

    def load_checkpoint(self, directory: str, tag: str | None = None) -> None:
        deepspeed_engine.load_checkpoint(self.engine, os.path.join(directory, "critic"), tag)


@torch.no_grad()
def token_advantages(
    chunks: list[Batch],
    rewards: list[torch.Tensor],
    device,
    gamma: float,
    lam: float,
    whiten: bool,
    values=None,
    kl=None,
    kl_coef: float = 0.0,
) -> tuple[list[Batch], dict[str, float]]:
    """Each chunk with its (b, C) GAE(gamma, lam) advantages (whitened over the whole step when
    ``whiten``; times the path weight) from ``rewards`` (b,) per chunk at each path's last
    token. ``values``: chunk -> (b, C) (the critic; the chunks then carry returns and
    old_values) or None (V = 0: with gamma = lam = 1 the advantage is the return-to-go,
    REINFORCE++). ``kl``: None, or chunk -> (b, C) detached per-token KL estimate whose
    -kl_coef multiple is each token's reward (kl_in="reward"). Returns the chunks (on the CPU,
    like batch.build_batches) and statistics measured before the update."""
    advs, rets, vals, kls = [], [], [], []
    for chunk, r in zip(chunks, rewards):
        on = chunk.to(device)
        v = values(on).float() if values is not None else torch.zeros_like(on.loss_mask)
        penalty = None
        if kl is not None:
            k = kl(on)  # (b, C)
            kls.append(float((k * on.loss_mask).sum()))
            penalty = -kl_coef * k
        token_r = ppo.token_rewards(r.to(device), on.loss_mask, penalty)  # (b, C)
        adv, ret = ppo.gae(token_r, v, on.loss_mask, gamma, lam)  # (b, C) each
        advs.append(adv.cpu())
        rets.append(ret.cpu())
        vals.append(v.cpu())
    masks = [c.loss_mask for c in chunks]
    if whiten:
        advs = ppo.whiten(advs, masks)
    critic = values is not None
    out = [
        dataclasses.replace(
            c,
            advantages=a * c.weight[:, None],
            returns=r if critic else None,
            old_values=v if critic else None,
        )
        for c, a, r, v in zip(chunks, advs, rets, vals)
    ]
    stats = {}
    if critic and chunks:
        flat = lambda xs: torch.cat([x[m != 0] for x, m in zip(xs, masks)])  # noqa: E731
        v, r = flat(vals), flat(rets)
        stats["learner/explained_variance"] = ppo.explained_variance(v, r, torch.ones_like(v))
    if kls:
        stats["learner/kl"] = sum(kls) / max(sum(c.tokens for c in chunks), 1)
    return out, stats
