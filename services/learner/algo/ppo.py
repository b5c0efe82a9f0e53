"""PPO's critic loss and update schedule (pure tensors): the clipped value loss, the explained
variance of the critic, and the mini-batch passes of a step. The critic's model and optimizer are
in model/critic.py; its advantages (GAE) are computed in advantages.py / gae.py.

Each function has a float64 twin in plain Python (``*_reference``), the test oracle.
"""

from __future__ import annotations


import torch


def passes(n_chunks: int, epochs: int, minibatches: int, generator) -> list[list[int]]:
    """PPO's optimizer steps over a step's chunks: ``epochs`` times, a fresh permutation of the
    chunk indices cut into ``minibatches`` near-equal parts (fewer when there are fewer
    chunks); one optimizer step per part."""
    parts = max(1, min(minibatches, n_chunks))
    out = []
    for _ in range(epochs):
        order = torch.randperm(n_chunks, generator=generator).tolist()
        out += [order[k * n_chunks // parts : (k + 1) * n_chunks // parts] for k in range(parts)]
    return out


def value_loss(values, old_values, returns, mask, clip: float) -> tuple[torch.Tensor, dict]:
    """Clipped value loss (PPO2), the masked token mean of
    0.5 * max((V - R)^2, (V_old + clip(V - V_old, -clip, clip) - R)^2); and its statistics."""
    m = mask.to(values.dtype)  # (B, T)
    n = m.sum().clamp(min=1.0)
    returns, old_values = returns.detach(), old_values.detach()
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    l1 = (values - returns) ** 2
    l2 = (clipped - returns) ** 2
    loss = 0.5 * (torch.maximum(l1, l2) * m).sum() / n
    with torch.no_grad():
        stats = {
            "value_clip_frac": float(((l2 > l1).to(m.dtype) * m).sum() / n),
            "value_mean": float((values * m).sum() / n),
        }
    return loss, stats


def explained_variance(values, returns, mask) -> float:
    """1 - Var(R - V) / Var(R) over valid tokens (1: the critic predicts the returns; 0: no
    better than their mean); 0 when the returns have no spread."""
    valid = mask != 0
    r, v = returns[valid].double(), values[valid].double()
    if r.numel() < 2 or float(r.var()) == 0.0:
        return 0.0
    return float(1.0 - (r - v).var() / r.var())


# ---- float64 twins in plain Python (test oracle) ------------------------------------------


def value_loss_reference(
    values: list[float], old: list[float], returns: list[float], clip: float
) -> float:
    terms = []
    for v, o, r in zip(values, old, returns):
        c = o + min(max(v - o, -clip), clip)
        terms.append(0.5 * max((v - r) ** 2, (c - r) ** 2))
    return sum(terms) / max(len(terms), 1)
