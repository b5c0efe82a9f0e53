"""KL control: the coefficient of the KL to the reference policy, and the KL as a per-token
penalty in the reward (pure; docs/algorithms.md "KL control").

``train.kl_control``:

    fixed     coef = train.kl_coef at every step
    adaptive  after each update that measured a per-token KL ``kl`` over ``paths`` paths
              (Ziegler et al. 2019, a proportional controller):
                  e     = clip(kl / target - 1, -0.2, 0.2)
                  coef <- coef * (1 + e * paths / horizon)

``train.kl_in="reward"`` (REINFORCE++): the KL estimate of each token is a reward
-coef * kl_t (detached: no gradient flows through it); with gamma = 1 its return-to-go is
subtracted from the path's advantage, so token t of path i gets

    A_it = A_i - w_i * coef * sum_{t' >= t} m_it' kl_it'

(w_i: the path weight already in A_i). ``train.kl_in="loss"`` keeps the KL a term of the loss
(kernels.clipped_policy_loss). Shapes: B paths, T completion positions.
"""

from __future__ import annotations

import torch

ERROR_CLIP = 0.2  # Ziegler et al.: the proportional error is clipped to +-20%


def adaptive_coef(coef: float, kl: float, target: float, horizon: int, paths: int) -> float:
    """The coefficient after one update that measured ``kl`` over ``paths`` paths."""
    error = min(max(kl / target - 1.0, -ERROR_CLIP), ERROR_CLIP)
    return coef * (1.0 + error * paths / horizon)


class KLController:
    """The KL coefficient of a run; the adaptive one is part of every checkpoint."""

    def __init__(self, train):
        self.control = train.kl_control
        self.coef = float(train.kl_coef)

    @property
    def adaptive(self) -> bool:
        return self.control.kind == "adaptive"

    def update(self, kl: float, paths: int) -> None:
        if self.adaptive and self.coef > 0:
            c = self.control
            self.coef = adaptive_coef(self.coef, kl, c.target, c.horizon, paths)

    def state(self) -> dict:
        return {"coef": self.coef}

    def restore(self, state: dict | None) -> None:
        """A resumed adaptive run continues with its coefficient; a fixed one keeps kl_coef."""
        if self.adaptive and state:
            self.coef = float(state["coef"])


def kl_reward_advantages(advantages, kl, mask, coef: float, path_weight=None) -> torch.Tensor:
    """(B, T) per-token advantages: (B,) ``advantages`` minus the weighted return-to-go of the
    per-token KL penalty; ``kl`` (B, T) is detached, padding (mask 0) adds nothing."""
    penalty = torch.where(mask != 0, kl.detach(), 0.0)  # (B, T)
    to_go = penalty.flip(-1).cumsum(-1).flip(-1)  # (B, T): sum over t' >= t
    w = torch.ones_like(advantages) if path_weight is None else path_weight
    return advantages[:, None] - (coef * w)[:, None] * to_go


def kl_reward_advantages_reference(advantages, kl, mask, coef: float, path_weight=None):
    """Plain Python twin: rows of per-token advantages."""
    out = []
    for b in range(kl.shape[0]):
        w = 1.0 if path_weight is None else float(path_weight[b])
        row = []
        for t in range(kl.shape[1]):
            rest = sum(float(kl[b, u]) for u in range(t, kl.shape[1]) if mask[b, u])
            row.append(float(advantages[b]) - w * coef * rest)
        out.append(row)
    return out
