"""services/rollout/explore/filtering.py against sort-based references, on irregular group sizes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from services.rollout.explore.filtering import DropLedger, adaptive_keep, mean_logprob_scores


def reference_keep(scores, retention):
    """Sort-based reference: k-th highest (NaN lowest) is the threshold, ties kept."""
    s = [(-math.inf if math.isnan(x) else x) for x in scores]
    k = math.ceil(round(retention * len(s), 9))
    threshold = sorted(s, reverse=True)[k - 1]
    return [x >= threshold for x in s], threshold


@pytest.mark.parametrize("P", [1, 2, 5, 10, 513, 1023])
@pytest.mark.parametrize("retention", [0.01, 0.3, 0.6, 1.0])
def test_adaptive_keep_matches_reference(P, retention):
    rng = np.random.default_rng(P)
    scores = rng.integers(0, 7, P).astype(float)  # many ties
    scores[rng.random(P) < 0.1] = np.nan
    keep, threshold = adaptive_keep(scores, retention)
    ref_keep, ref_threshold = reference_keep(scores.tolist(), retention)
    assert keep.dtype == bool and keep.shape == (P,)
    assert keep.tolist() == ref_keep and threshold == ref_threshold
    assert keep.sum() >= math.ceil(round(retention * P, 9))


def test_adaptive_keep_keeps_the_highest_scored():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=1000)
    keep, threshold = adaptive_keep(scores, 0.6)
    assert keep.sum() == 600  # distinct scores: exactly ceil(0.6·P)
    assert scores[keep].min() == threshold > scores[~keep].max()
    keep5, _ = adaptive_keep(np.array([5.0, 1.0, 4.0, 2.0, 3.0]), 0.6)  # 0.6·5 = 3.0000000000000004
    assert keep5.tolist() == [True, False, True, False, True]
    assert adaptive_keep(scores, 1.0)[0].all()
    assert adaptive_keep(np.array([np.nan, 1.0, np.nan]), 0.3)[0].tolist() == [False, True, False]
    keep_nan, thr_nan = adaptive_keep(
        np.array([np.nan, 1.0, np.nan]), 0.5
    )  # k = 2 reaches the NaNs: ties kept
    assert keep_nan.all() and thr_nan == -math.inf
    empty, thr = adaptive_keep(np.array([]), 0.6)
    assert empty.shape == (0,) and thr == math.inf


@pytest.mark.parametrize("retention", [0.0, -0.1, 1.01, float("nan")])
def test_adaptive_keep_rejects_bad_retention(retention):
    with pytest.raises(ValueError, match="retention"):
        adaptive_keep(np.ones(4), retention)


def test_adaptive_keep_rejects_non_vector():
    with pytest.raises(ValueError, match="shape"):
        adaptive_keep(np.ones((2, 3)), 0.5)


def test_mean_logprob_scores():
    rng = np.random.default_rng(1)
    lps = [rng.normal(-1, 0.5, rng.integers(0, 20)).tolist() for _ in range(1023)]
    lps[0] = []
    for prefix in (None, 1, 4, 100):
        got = mean_logprob_scores(lps, prefix)
        ref = [(-math.inf if not x else sum(x[:prefix]) / len(x[:prefix])) for x in lps]
        assert got.shape == (1023,)
        np.testing.assert_allclose(got, ref, rtol=1e-12)
    assert mean_logprob_scores([[-1.0, -3.0, -100.0]], 2).tolist() == [-2.0]
    assert mean_logprob_scores([]).shape == (0,)
    with pytest.raises(ValueError, match="prefix_tokens"):
        mean_logprob_scores([[-1.0]], 0)


def test_drop_ledger_accounts_for_every_path():
    ledger = DropLedger()
    ledger.drop([0, 3], "duplicate")
    ledger.drop(np.array([False, True, False, False, False, False]), "truncated")
    ledger.drop([5], "duplicate")
    assert ledger.counts() == {"duplicate": 3, "truncated": 1}
    kept = ledger.kept(6)
    assert kept.tolist() == [False, False, True, False, True, False]
    ledger.assert_complete(6)
    ledger.assert_complete(6, kept)
    ledger.assert_complete(6, 2)


def test_drop_ledger_catches_double_drops_atomically():
    ledger = DropLedger()
    ledger.drop([1, 2], "low_score")
    with pytest.raises(ValueError, match="path 2 dropped twice"):
        ledger.drop([4, 2], "duplicate")
    assert ledger.counts() == {"low_score": 2}  # nothing of the failed call recorded
    with pytest.raises(ValueError, match="twice"):
        ledger.drop([7, 7], "duplicate")
    with pytest.raises(ValueError):
        ledger.drop([-1], "duplicate")
    with pytest.raises(ValueError):
        ledger.drop([3], "")


def test_drop_ledger_catches_incomplete_accounting():
    ledger = DropLedger()
    ledger.drop([0, 1], "duplicate")
    with pytest.raises(ValueError, match="incomplete"):
        ledger.assert_complete(5, 2)  # 2 kept + 2 dropped != 5 generated: a path went missing
    with pytest.raises(ValueError, match="incomplete"):
        ledger.assert_complete(5, np.array([False, False, True, False, True]))
    with pytest.raises(ValueError, match="both kept and dropped"):
        ledger.assert_complete(3, np.array([True, False, True]))
    with pytest.raises(ValueError, match="out of range"):
        ledger.assert_complete(1)
    with pytest.raises(ValueError, match="out of range"):
        ledger.kept(1)
    DropLedger().assert_complete(0)
    assert DropLedger().kept(1).tolist() == [True]
