"""KL control: the coefficient of the KL to the reference policy, and the KL as a per-token
penalty in the reward (pure; docs/algorithms.md "KL control").

``train.kl_control``:

    fixed     coef = train.kl_coef at every step
    adaptive  after each update that measured a per-token KL ``kl`` over ``paths`` paths
              (Ziegler et al. 2019, a proportional controller):
                  e     = clip(kl / target - 1, -0.2, 0.2)
                  coef <- coef * (1 + e * paths / horizon)

``train.kl_in="reward"`` (REINFORCE++) makes the KL a per-token reward penalty -coef * kl_t: the
advantages take it (advantages.py: ``kl_penalised`` for the group-level estimators, the token
rewards of the token-level ones). ``train.kl_in="loss"`` keeps the KL a term of the loss
(kernels.clipped_policy_loss).
"""

from __future__ import annotations

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
