"""The learning rate of an optimizer step: a linear warm-up to the base rate (TrainConfig).

The step count is the optimizer's own (DeepSpeed's ``global_steps``, saved in checkpoints), so a
resumed run continues the warm-up where it stopped; the base rate is the run's ``lr`` or the
lower one a rollback set (guard/actions.py), so a warm-up in progress scales that one.
"""

from __future__ import annotations


def warmup_factor(done_steps: int, warmup_steps: int) -> float:
    """The factor on the base rate for the optimizer step after ``done_steps`` steps:
    (done_steps + 1) / warmup_steps until it reaches 1; 1 when ``warmup_steps`` is 0."""
    if done_steps < 0 or warmup_steps < 0:
        raise ValueError(f"steps must be >= 0, got {done_steps} done, {warmup_steps} warm-up")
    if warmup_steps == 0:
        return 1.0
    return min(1.0, (done_steps + 1) / warmup_steps)
