"""The learning rate of an optimizer step: a linear warm-up to the base rate, then the base rate
held or decayed to a floor by the run's last optimizer step (TrainConfig ``lr_warmup_steps``,
``lr_decay``, ``lr_min_ratio``).

The step count is the optimizer's own (DeepSpeed's ``global_steps``, saved in checkpoints), so a
resumed run continues the warm-up and the decay where it stopped; the base rate is the run's
``lr`` or the lower one a rollback set (guard/actions.py), so the schedule scales that one.
"""

from __future__ import annotations

import math

DECAYS = ("constant", "linear", "cosine")


def warmup_factor(done_steps: int, warmup_steps: int) -> float:
    """The factor on the base rate for the optimizer step after ``done_steps`` steps:
    (done_steps + 1) / warmup_steps until it reaches 1; 1 when ``warmup_steps`` is 0."""
    if done_steps < 0 or warmup_steps < 0:
        raise ValueError(f"steps must be >= 0, got {done_steps} done, {warmup_steps} warm-up")
    if warmup_steps == 0:
        return 1.0
    return min(1.0, (done_steps + 1) / warmup_steps)


def decay_factor(
    done_steps: int, warmup_steps: int, total_steps: int, decay: str, floor: float
) -> float:
    """The decay's factor for the optimizer step after ``done_steps`` steps of a run of
    ``total_steps``: 1 through the warm-up and at its first step after, then falling
    (``linear`` or half a ``cosine``) to ``floor`` at step ``total_steps - 1`` and staying
    there (a run resumed past its planned end); ``constant``: always 1."""
    if decay not in DECAYS:
        raise ValueError(f"decay must be one of {DECAYS}, got {decay!r}")
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"floor must be within [0, 1], got {floor}")
    if done_steps < 0 or warmup_steps < 0 or total_steps < 1:
        raise ValueError(
            f"steps must be >= 0 (total >= 1), got {done_steps} done, {warmup_steps} warm-up, "
            f"{total_steps} in all"
        )
    span = total_steps - 1 - warmup_steps  # steps from the warm-up's end to the last step
    if decay == "constant" or done_steps <= warmup_steps or span <= 0:
        return 1.0
    progress = min(1.0, (done_steps - warmup_steps) / span)
    shape = 1.0 - progress if decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return floor + (1.0 - floor) * shape


def lr_factor(
    done_steps: int, warmup_steps: int, total_steps: int, decay: str = "constant",
    floor: float = 0.0,
) -> float:  # fmt: skip
    """The factor on the base rate of the optimizer step after ``done_steps`` steps: the
    warm-up's times the decay's."""
    return warmup_factor(done_steps, warmup_steps) * decay_factor(
        done_steps, warmup_steps, total_steps, decay, floor
    )
