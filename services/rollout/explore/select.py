"""Broadened exploration on the rollout side, for one prompt job's sampled candidates:

  M candidates ─► near-duplicate dedup ─► dynamic filtering ─► keep n ─► reward evaluation
                   (MinHash clusters)      (quality predictor,
                                             adaptive threshold)

Every candidate is either kept or dropped with a reason, so generated = kept + dropped
(checked by DropLedger). Dropped paths never reach the (expensive) reward evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from brorl import sampling
from brorl.v1 import common_pb2
from services.rollout.explore.diversity import (
    dedup,
    embedding_clusters,
    near_duplicate_clusters,
    path_diversity_index,
    unique_ngram_ratio,
)
from services.rollout.explore.filtering import DropLedger, adaptive_keep, mean_logprob_scores

# scores the given candidate indices with a reward function on their prefixes
PrefixScorer = Callable[[str, list[int], int], np.ndarray]


@dataclass
class Selection:
    kept: list[int]  # candidate indices, in candidate order
    weights: dict[int, float] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)


def select(
    samples,
    n_keep: int,
    explore: common_pb2.ExploreParams,
    prefix_scorer: PrefixScorer | None = None,
) -> Selection:
    x = sampling.effective_explore(explore)
    seqs = [list(s.token_ids) for s in samples]
    P = len(seqs)
    ledger = DropLedger()
    stats = {
        "explore/pdi": path_diversity_index(seqs),
        "explore/unique_ngram_ratio": unique_ngram_ratio(seqs),
    }
    weights = np.ones(P)

    alive = np.arange(P)
    mode = x.dedup
    if mode != "off" and P > 1:
        if x.dedup_method == "embedding":
            clusters = embedding_clusters(
                [s.text for s in samples], x.embedding_model, threshold=x.dedup_threshold
            )
        else:
            clusters = near_duplicate_clusters(seqs, threshold=x.dedup_threshold)
        weights = dedup(clusters, mode)
        stats["explore/clusters"] = float(clusters.max() + 1) if P else 0.0
        if mode == "keep_one":
            ledger.drop([int(i) for i in np.flatnonzero(weights == 0)], "duplicate")
            alive = np.flatnonzero(weights > 0)

    retention = x.retention
    scores = None
    if retention < 1 or len(alive) > n_keep:
        scores = _predict(samples, alive, x, prefix_scorer)
    if retention < 1 and len(alive):
        keep, threshold = adaptive_keep(scores, retention)
        ledger.drop([int(i) for i in alive[~keep]], "path_filter")
        stats["explore/filter_threshold"] = float(threshold)
        alive, scores = alive[keep], scores[keep]
    if len(alive) > n_keep:
        # hierarchical generation: keep the n best-predicted of the oversampled candidates
        order = np.argsort(-np.nan_to_num(scores, nan=-np.inf), kind="stable")
        ledger.drop([int(i) for i in alive[order[n_keep:]]], "oversample")
        alive = np.sort(alive[order[:n_keep]])

    ledger.assert_complete(P, kept=len(alive))
    kept = [int(i) for i in alive]
    return Selection(
        kept=kept,
        weights={i: float(weights[i]) for i in kept},
        dropped=ledger.counts(),
        stats=stats,
    )


def _predict(samples, alive: np.ndarray, x: sampling.EffectiveExplore, prefix_scorer) -> np.ndarray:
    prefix = x.predictor_prefix_tokens or None
    predictor = x.predictor
    if predictor == "logprob":
        return mean_logprob_scores([list(samples[i].logprobs) for i in alive], prefix)
    if prefix_scorer is None:
        raise ValueError(f"predictor {predictor!r} needs the reward service")
    return prefix_scorer(predictor, [int(i) for i in alive], prefix or 0)
