"""The run config's ``train.ppo`` section: PPO with a critic (estimator ``ppo``;
docs/algorithms.md). The math is in services/learner/algo/ (advantages.py, gae.py, ppo.py), the
critic in services/learner/model/critic.py."""

from __future__ import annotations

from pydantic import Field

from brorl.config.base import StrictModel


class PPOConfig(StrictModel):
    epochs: int = Field(4, ge=1, description="Passes over a step's paths (optimizer steps each).")
    minibatches: int = Field(
        2,
        ge=1,
        description="Optimizer steps per epoch: the step's chunks (of at most "
        "micro_batch_paths paths of one group) are shuffled and cut into this many parts.",
    )
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="GAE discount per token.")
    lam: float = Field(0.95, ge=0.0, le=1.0, description="GAE lambda.")
    value_clip: float = Field(
        0.2,
        gt=0.0,
        description="Clipped value loss: the critic moves at most this far from "
        "its values at the step's start.",
    )
    value_lr: float = Field(
        0.0, ge=0.0, le=1.0, description="The critic's AdamW learning rate (0: train.lr)."
    )
    whiten: bool = Field(
        True, description="Normalise the step's GAE advantages to mean 0, std 1 over its tokens."
    )
