"""Training on a subset of each wide group: sample N paths, update on the m most informative.

Sampling is cheap next to the update when the learner is the slower stage (long completions, a
bigger model, a CPU without bf16: docs/performance.md). PODS (Xu et al., "Not All Rollouts are
Useful: Down-Sampling Rollouts in LLM Reinforcement Learning", 2025) keeps the width of the
exploration and trains on m of a group's N paths, chosen so that their rewards vary the most:

    max_variance   the m paths whose rewards have the largest variance. Such a subset is always
                   the i highest rewards plus the m - i lowest, for some i in 0..m (moving a
                   kept reward away from the kept mean, to a more extreme one on its side, only
                   raises the variance), so one sort and prefix sums try every i: O(N log N).
                   For 0/1 rewards it is as many right as wrong paths as the group allows.
    random         m paths uniformly (the ablation's baseline).

Paths of equal reward are taken in a random order (``rng``), so which of them are kept carries
no bias from the order the worker listed them in (its sampling or finishing order). The group's
advantages are then computed over the kept paths, as PODS does: the update sees a group of m.
A group of at most m paths is kept whole. ``max_variance_reference`` (plain Python, every subset)
is the test oracle.

Shapes: N paths of a group, m kept.
"""

from __future__ import annotations

import itertools

import numpy as np

from brorl.config.train import TrainConfig
from brorl.v1 import common_pb2


def max_variance_subset(rewards, m: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """Indices (ascending) of ``m`` of the rewards (N,) whose variance is the largest; ties in
    variance go to the most balanced split (i nearest m / 2), ties in reward to ``rng``'s order
    (index order without one)."""
    r = np.asarray(rewards, dtype=np.float64)  # (N,)
    n = r.size
    if not 0 <= m <= n:
        raise ValueError(f"cannot keep {m} of {n} paths")
    if m == n:
        return np.arange(n)
    perm = rng.permutation(n) if rng is not None else np.arange(n)  # (N,) tie order
    order = perm[np.argsort(r[perm], kind="stable")]  # (N,) ascending reward
    s = r[order]
    s = s - s.mean()  # variance is shift-free; centring keeps the prefix sums' sums small
    c1 = np.concatenate(([0.0], np.cumsum(s)))  # (N+1,) sum of the k lowest
    c2 = np.concatenate(([0.0], np.cumsum(s * s)))  # (N+1,)
    i = np.arange(m + 1)  # (m+1,) paths taken from the top
    total1 = c1[m - i] + (c1[n] - c1[n - i])  # (m+1,)
    total2 = c2[m - i] + (c2[n] - c2[n - i])
    var = total2 / m - (total1 / m) ** 2 if m else np.zeros(1)  # (m+1,) population variance
    best = var.max()
    # within rounding of the best, the most balanced split
    near = np.flatnonzero(var >= best - 1e-12 * max(1.0, abs(best)))
    top = int(near[np.argmin(np.abs(near - m / 2))])
    chosen = np.concatenate((order[: m - top], order[n - top :]))
    return np.sort(chosen)


def random_subset(n: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """Indices (ascending) of ``m`` of ``n`` paths drawn uniformly without replacement."""
    if not 0 <= m <= n:
        raise ValueError(f"cannot keep {m} of {n} paths")
    return np.sort(rng.choice(n, size=m, replace=False))


def max_variance_reference(rewards: list[float], m: int) -> float:
    """The largest population variance of any ``m`` of ``rewards``, by trying every subset
    (float64, plain Python; small N only)."""
    best = 0.0
    for subset in itertools.combinations(rewards, m):
        mean = sum(subset) / m
        best = max(best, sum((x - mean) ** 2 for x in subset) / m)
    return best


def keep_paths(
    groups: list[common_pb2.PathGroup], train: TrainConfig, step: int
) -> list[common_pb2.PathGroup]:
    """Each group with at most ``train.keep_paths`` of its paths, chosen by ``train.keep_rule``
    (0 keeps every path) with the random order of (``train.seed``, ``step``), so a resumed run
    keeps the same paths. The groups given are not changed: a shortened group is a copy."""
    m = train.keep_paths
    if m == 0:
        return groups
    rng = np.random.default_rng([train.seed % 2**32, step])
    out = []
    for g in groups:
        n = len(g.paths)
        if n <= m:
            out.append(g)
            continue
        if train.keep_rule == "max_variance":
            kept = max_variance_subset([p.reward for p in g.paths], m, rng)
        else:
            kept = random_subset(n, m, rng)
        short = common_pb2.PathGroup()
        short.CopyFrom(g)
        del short.paths[:]
        short.paths.extend(g.paths[int(i)] for i in kept)
        out.append(short)
    return out
