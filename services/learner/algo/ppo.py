"""PPO's critic math (pure tensors): token rewards, GAE, advantage whitening, the clipped value
loss. The critic's model and optimizer are in critic.py; the epochs and mini-batches in policy.py.

A path is an episode whose tokens are its actions: token t of path i gets the reward

    r_it = -kl_coef * k_it  (kl_in="reward"; 0 otherwise)   + [t is the path's last token] R_i

and with values V_it = V(prompt + tokens < t) from the critic (the value after the last token
is 0: the episode ends there), GAE(gamma, lam) is

    delta_it = r_it + gamma * V_i,t+1 - V_it        A_it = sum_l (gamma * lam)^l delta_i,t+l
    returns_it = A_it + V_it                        (the critic's regression target)

Completions are right-padded, so a path's valid tokens are a prefix of its row (mask (B, T)).
Each function has a float64 twin in plain Python (``*_reference``), the test oracle.
"""

from __future__ import annotations

import math

import torch


def token_rewards(rewards, mask, token_penalty=None) -> torch.Tensor:
    """(B, T) per-token rewards: ``rewards`` (B,) at each path's last valid token, plus the
    (B, T) ``token_penalty`` (e.g. -kl_coef * k) on valid tokens. A path without tokens gets
    nothing."""
    m = mask.to(torch.promote_types(rewards.dtype, torch.float32))  # (B, T)
    lengths = m.sum(dim=1).long()  # (B,)
    out = torch.zeros_like(m)
    rows = torch.nonzero(lengths > 0).squeeze(1)  # (b',)
    out[rows, lengths[rows] - 1] = rewards.to(out.dtype)[rows]
    if token_penalty is not None:
        out = out + token_penalty.to(out.dtype) * m
    return out


def gae(rewards, values, mask, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), both (B, T) and 0 on masked positions, from (B, T) token rewards
    and values; the value after a path's last valid token is 0."""
    m = mask.to(values.dtype)  # (B, T)
    v = values * m
    B, T = v.shape
    adv = torch.zeros_like(v)
    running = torch.zeros(B, dtype=v.dtype, device=v.device)  # (B,)
    for t in range(T - 1, -1, -1):
        next_v = v[:, t + 1] if t + 1 < T else torch.zeros_like(running)
        next_m = m[:, t + 1] if t + 1 < T else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_v - v[:, t]
        running = (delta + gamma * lam * running * next_m) * m[:, t]
        adv[:, t] = running
    return adv, (adv + v) * m


def whiten(xs: list[torch.Tensor], masks: list[torch.Tensor], eps: float = 1e-8) -> list:
    """Every (b, C) ``x`` of a step shifted and scaled by one mean and (Bessel) std over the
    valid tokens of them all (so chunks of any width share one scale); all zeros when fewer
    than two tokens or no spread. Masked positions stay 0."""
    valid = [m != 0 for m in masks]
    flat = torch.cat([x[v] for x, v in zip(xs, valid)]) if xs else torch.zeros(0)  # (n,)
    if flat.numel() < 2 or bool(flat.std() == 0):
        return [torch.zeros_like(x) for x in xs]
    mean, std = flat.mean(), flat.std()
    zero = torch.zeros_like
    return [torch.where(v, (x - mean) / (std + eps), zero(x)) for x, v in zip(xs, valid)]


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


def gae_reference(
    rewards: list[float], values: list[float], gamma: float, lam: float
) -> tuple[list[float], list[float]]:
    """One path's valid tokens: advantages and returns, from the definition (a sum over l)."""
    T = len(values)
    nxt = values[1:] + [0.0]
    deltas = [rewards[t] + gamma * nxt[t] - values[t] for t in range(T)]
    adv = [sum((gamma * lam) ** (s - t) * deltas[s] for s in range(t, T)) for t in range(T)]
    return adv, [a + v for a, v in zip(adv, values)]


def whiten_reference(xs: list[float], eps: float = 1e-8) -> list[float]:
    if len(xs) < 2 or all(x == xs[0] for x in xs):
        return [0.0] * len(xs)
    m = sum(xs) / len(xs)
    s = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    return [(x - m) / (s + eps) for x in xs]


def value_loss_reference(
    values: list[float], old: list[float], returns: list[float], clip: float
) -> float:
    terms = []
    for v, o, r in zip(values, old, returns):
        c = o + min(max(v - o, -clip), clip)
        terms.append(0.5 * max((v - r) ** 2, (c - r) ** 2))
    return sum(terms) / max(len(terms), 1)
