"""Filtering a wide path group before scoring/learning: adaptive keep, cheap quality scores and a
ledger that accounts for every dropped path. Pure numpy (no gRPC, no vLLM). P = paths in a group.

* ``adaptive_keep`` keeps the top ``ceil(retention·P)`` paths by score; the threshold adapts to
  the batch (it is the k-th highest score) and ties at the threshold are kept, so at least
  k paths survive. NaN scores rank lowest (as -inf).
* ``mean_logprob_scores`` is a zero-cost quality predictor: the policy's own mean sampling
  log-prob over a path's first ``prefix_tokens`` tokens (all when None); -inf for an empty path.
* ``DropLedger`` records why paths were dropped (one reason per path) so the worker can report
  counts per reason and check that generated == kept + dropped.
"""

from __future__ import annotations

import math
from itertools import chain
from typing import Iterable, Sequence

import numpy as np


def _keep_count(retention: float, P: int) -> int:
    """k = ceil(retention·P), robust to float noise (0.6·5 = 3.0000000000000004 → 3)."""
    return max(1, math.ceil(round(retention * P, 9))) if P else 0


def adaptive_keep(scores: np.ndarray, retention: float = 0.6) -> tuple[np.ndarray, float]:
    """Keep the highest-scored paths -> (keep mask (P,) bool, threshold).

    threshold = k-th highest score with k = ceil(retention·P); every path scoring ≥ threshold is
    kept (ties too). retention in (0, 1]; 1.0 keeps all. For P = 0 the threshold is +inf."""
    if not (isinstance(retention, (int, float)) and 0.0 < retention <= 1.0):
        raise ValueError(f"retention must be in (0, 1], got {retention!r}")
    s = np.asarray(scores, dtype=np.float64)  # (P,)
    if s.ndim != 1:
        raise ValueError(f"scores must be one score per path, shape (P,); got shape {s.shape}")
    P = s.size
    if P == 0:
        return np.zeros(0, dtype=bool), math.inf
    s = np.where(np.isnan(s), -np.inf, s)  # NaN ranks lowest
    k = _keep_count(retention, P)
    threshold = float(np.partition(s, P - k)[P - k])  # k-th highest
    return s >= threshold, threshold


def mean_logprob_scores(
    logprobs: Sequence[Sequence[float]], prefix_tokens: int | None = None
) -> np.ndarray:
    """Mean sampling log-prob over each path's first prefix_tokens tokens (all when None) -> (P,)
    float64; -inf for an empty path."""
    if prefix_tokens is not None and (isinstance(prefix_tokens, bool) or prefix_tokens < 1):
        raise ValueError(
            f"prefix_tokens must be None (all tokens) or at least 1, got {prefix_tokens!r}"
        )
    P = len(logprobs)
    lengths = np.fromiter((len(x) for x in logprobs), dtype=np.int64, count=P)  # (P,)
    used = lengths if prefix_tokens is None else np.minimum(lengths, prefix_tokens)  # (P,)
    if prefix_tokens is None:
        flat = np.fromiter(
            chain.from_iterable(logprobs), dtype=np.float64, count=int(lengths.sum())
        )
    else:
        flat = np.fromiter(
            chain.from_iterable(x[:prefix_tokens] for x in logprobs),
            dtype=np.float64,
            count=int(used.sum()),
        )  # (T,)
    owner = np.repeat(np.arange(P), used)  # (T,)
    sums = np.bincount(owner, weights=flat, minlength=P)  # (P,)
    out = np.full(P, -np.inf)
    nonempty = used > 0
    out[nonempty] = sums[nonempty] / used[nonempty]
    return out


class DropLedger:
    """Why each dropped path of one group was dropped; a path may be dropped only once."""

    def __init__(self) -> None:
        self._reason: dict[int, str] = {}  # path index -> reason

    def drop(self, index_list: Iterable[int] | np.ndarray, reason: str) -> None:
        """Record paths dropped for ``reason``; a bool mask (P,) or indices. All-or-nothing:
        raises ValueError (recording none) if any path is already dropped or repeated."""
        if not isinstance(reason, str) or not reason:
            raise ValueError(f"reason must be a non-empty string, got {reason!r}")
        arr = np.asarray(index_list)
        if arr.dtype == bool:
            arr = np.flatnonzero(arr)
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"drop takes path indices or a bool mask, got dtype {arr.dtype}")
        idx = [int(i) for i in arr.reshape(-1)]
        seen: set[int] = set()
        for i in idx:
            if i < 0:
                raise ValueError(f"path index must be non-negative, got {i}")
            if i in self._reason:
                raise ValueError(
                    f"path {i} dropped twice: first for {self._reason[i]!r}, again for {reason!r}"
                )
            if i in seen:
                raise ValueError(f"path {i} listed twice in one drop for {reason!r}")
            seen.add(i)
        for i in idx:
            self._reason[i] = reason

    def dropped(self) -> dict[int, str]:
        """Copy of path index -> reason."""
        return dict(self._reason)

    def kept(self, P: int) -> np.ndarray:
        """Mask (P,) bool of paths not dropped; ValueError if a dropped index is ≥ P."""
        self._check_range(P)
        mask = np.ones(P, dtype=bool)
        mask[list(self._reason)] = False
        return mask

    def counts(self) -> dict[str, int]:
        """Dropped paths per reason, in order of first use."""
        out: dict[str, int] = {}
        for r in self._reason.values():
            out[r] = out.get(r, 0) + 1
        return out

    def assert_complete(self, P: int, kept: np.ndarray | int | None = None) -> None:
        """Check generated == kept + Σ dropped; raise ValueError if not.

        ``kept`` is what the caller actually kept: a bool mask (P,) (must be exactly the paths not
        dropped), a count, or None (the ledger's own view; then only index ranges are checked)."""
        self._check_range(P)
        dropped = len(self._reason)
        if kept is None:
            n_kept = P - dropped
        elif isinstance(kept, (int, np.integer)) and not isinstance(kept, bool):
            n_kept = int(kept)
        else:
            mask = np.asarray(kept)
            if mask.dtype != bool or mask.shape != (P,):
                raise ValueError(
                    f"kept must be a bool mask of shape ({P},), got {mask.dtype} {mask.shape}"
                )
            both = [i for i in self._reason if mask[i]]
            if both:
                raise ValueError(f"paths {both[:10]} are both kept and dropped")
            n_kept = int(mask.sum())
        if n_kept + dropped != P:
            raise ValueError(
                f"incomplete accounting: generated {P} != kept {n_kept} + dropped {dropped} "
                f"{self.counts()}"
            )

    def _check_range(self, P: int) -> None:
        bad = sorted(i for i in self._reason if i >= P)
        if bad:
            raise ValueError(
                f"dropped path indices {bad[:10]} out of range for a group of {P} paths"
            )
