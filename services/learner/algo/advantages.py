"""Advantage estimators: one step's per-group rewards → one advantage per path (pure tensors).

``train.estimator`` picks one (docs/algorithms.md). For a group of G paths with rewards r:

    grpo          A = (r - mean r) / (std r + eps)   (normalize_std)   |   r - mean r   (not)
    dr_grpo       A =  r - mean r                    and the loss is a token sum / constant
    rloo          A =  r - mean_{j != i} r_j  =  G / (G - 1) * (r - mean r);  G == 1 -> 0
    reinforce_pp  a =  r - mean r per group, then over ALL paths of the step:
                  A = (a - mean_all a) / (std_all a + eps)

std is the sample (Bessel-corrected) standard deviation, as in ``kernels.group_advantages``, and
a group whose rewards are all equal gets advantage 0 exactly under every estimator.
``normalize_std`` only applies to grpo. Every estimator has a float64 twin in plain Python
(``advantages_reference``), written independently, as the test oracle.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch

from kernels import group_advantages

Estimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"]
ESTIMATORS: tuple[str, ...] = get_args(Estimator)
EPS = 1e-6  # kernels.group_advantages' default


def advantages(
    groups_rewards: list[torch.Tensor],
    estimator: str = "grpo",
    normalize_std: bool = True,
    eps: float = EPS,
) -> list[torch.Tensor]:
    """One (G,) advantage tensor per (G,) reward tensor; groups may differ in size."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; one of {ESTIMATORS}")
    norm = normalize_std and estimator == "grpo"
    centred = _group_kernel(groups_rewards, norm, eps)  # list of (G,)
    if estimator in ("grpo", "dr_grpo"):
        return centred
    if estimator == "rloo":
        # r_i - mean_{j != i} r_j = G/(G-1) (r_i - mean r); a lone path has no baseline: 0
        return [a * (len(a) / (len(a) - 1)) if len(a) > 1 else torch.zeros_like(a) for a in centred]
    # reinforce_pp: the group-centred advantages, normalised over the whole step
    if not centred:
        return []
    flat = torch.cat(centred)  # (N,) all paths of the step
    if len(flat) < 2:
        return [torch.zeros_like(a) for a in centred]
    mean, std = flat.mean(), flat.std()  # scalars; std Bessel-corrected
    if bool(std == 0):  # every group degenerate: all zeros already
        return [torch.zeros_like(a) for a in centred]
    return [(a - mean) / (std + eps) for a in centred]


def _group_kernel(
    groups_rewards: list[torch.Tensor], normalize_std: bool, eps: float
) -> list[torch.Tensor]:
    """kernels.group_advantages per group: equal sizes stacked into one (P, G) call."""
    out: list[torch.Tensor | None] = [None] * len(groups_rewards)
    by_size: dict[int, list[int]] = {}
    for i, r in enumerate(groups_rewards):
        by_size.setdefault(len(r), []).append(i)
    for size, idx in by_size.items():
        if size == 0:
            for i in idx:
                out[i] = torch.zeros(0, device=groups_rewards[i].device)
            continue
        rewards = torch.stack([groups_rewards[i] for i in idx])  # (P, G)
        adv, _ = group_advantages(rewards, normalize_std=normalize_std, eps=eps)  # (P, G)
        for row, i in enumerate(idx):
            out[i] = adv[row]
    return out  # type: ignore[return-value]


def length_normalised(estimator: str) -> bool:
    """Whether the step's loss is a mean over its tokens (every estimator but dr_grpo)."""
    return estimator != "dr_grpo"


def loss_denominator(estimator: str, total_tokens: int, paths: int, max_tokens: int) -> float:
    """What the step's summed token loss is divided by: its token count (token mean), or for
    dr_grpo the constant paths × max_tokens (Dr. GRPO: no per-length normalisation)."""
    if length_normalised(estimator):
        return float(max(total_tokens, 1))
    return float(max(paths * max_tokens, total_tokens, 1))


# ---- float64 twins in plain Python (test oracle) ------------------------------------------


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _sample_std(xs: list[float]) -> float:
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def advantages_reference(
    groups_rewards: list[list[float]],
    estimator: str = "grpo",
    normalize_std: bool = True,
    eps: float = EPS,
) -> list[list[float]]:
    out: list[list[float]] = []
    for r in groups_rewards:
        G = len(r)
        if G == 0 or all(x == r[0] for x in r):
            out.append([0.0] * G)
        elif estimator == "rloo":
            out.append(
                [x - sum(r[j] for j in range(G) if j != i) / (G - 1) for i, x in enumerate(r)]
            )
        elif estimator == "grpo" and normalize_std:
            m, s = _mean(r), _sample_std(r)
            out.append([(x - m) / (s + eps) for x in r])
        else:  # grpo without std, dr_grpo, and reinforce_pp's first stage
            m = _mean(r)
            out.append([x - m for x in r])
    if estimator == "reinforce_pp":
        flat = [a for g in out for a in g]
        if len(flat) < 2 or all(a == flat[0] for a in flat):
            return [[0.0] * len(g) for g in out]
        m, s = _mean(flat), _sample_std(flat)
        out = [[(a - m) / (s + eps) for a in g] for g in out]
    return out
