"""Token-level returns (pure tensors): per-token rewards, GAE(gamma, lam) and whitening over a
step, for the estimators whose advantages are per token (advantages.py: ppo, and reinforce_pp with
the KL in the reward).

A path is an episode whose tokens are its actions: token t of path i gets the reward

    r_it = -kl_coef * k_it  (kl_in="reward"; 0 otherwise)   + [t is the path's last token] R_i

and with values V_it = V(prompt + tokens < t) from the critic (the value after the last token
is 0: the episode ends there; V = 0 without a critic), GAE(gamma, lam) is

    delta_it = r_it + gamma * V_i,t+1 - V_it        A_it = sum_l (gamma * lam)^l delta_i,t+l
    returns_it = A_it + V_it                        (the critic's regression target)

Completions are right-padded, so a path's valid tokens are a prefix of its row (mask (B, T)).
An episode's policy tokens are not (the environment's tokens between its turns are not actions,
mask 0): ``left_align`` gathers each row's valid positions to the left, so that GAE runs over
the policy's tokens alone, and ``scatter_back`` puts the results in place.
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


def left_align(mask) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(index (B, T'), aligned mask (B, T')): ``x.gather(1, index)`` holds each row's valid
    positions first, in order; None when every row's valid positions are a prefix already.
    Padding entries index column T (``scatter_back`` drops it)."""
    valid = mask != 0  # (B, T)
    counts = valid.sum(dim=1)  # (B,)
    T = valid.shape[1]
    if bool((valid == (torch.arange(T, device=mask.device)[None, :] < counts[:, None])).all()):
        return None
    width = max(int(counts.max()), 1)
    aligned = torch.arange(width, device=mask.device)[None, :] < counts[:, None]  # (B, T')
    # stable order of valid positions first: sort on (not valid, position)
    key = (~valid).long() * (T + 1) + torch.arange(T, device=mask.device)[None, :]
    index = key.argsort(dim=1)[:, :width]  # (B, T')
    index = torch.where(aligned, index, torch.full_like(index, T))
    return index, aligned.to(mask.dtype)


def gather_aligned(x, index) -> torch.Tensor:
    """x (B, T) at ``index`` (B, T') of left_align; padding entries read 0."""
    padded = torch.cat([x, torch.zeros_like(x[:, :1])], dim=1)  # (B, T + 1)
    return padded.gather(1, index)


def scatter_back(x_aligned, index, T: int) -> torch.Tensor:
    """(B, T) with ``x_aligned`` (B, T') at its positions, 0 elsewhere (inverse of gather)."""
    out = torch.zeros(x_aligned.shape[0], T + 1, dtype=x_aligned.dtype, device=x_aligned.device)
    return out.scatter(1, index, x_aligned)[:, :T]


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
