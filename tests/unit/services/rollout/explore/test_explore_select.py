"""services.rollout.explore.select.select: dedup, dynamic filtering and hierarchical keep-n, with
every candidate accounted for (generated = kept + dropped by reason)."""

import numpy as np
import pytest

from brorl.v1 import common_pb2
from services.rollout.engine import Sample
from services.rollout.explore.select import select


def samples_from(seqs, logprobs=None):
    logprobs = logprobs or [[-1.0] * len(s) for s in seqs]
    return [
        Sample(token_ids=s, logprobs=lp, text="", finish_reason="stop")
        for s, lp in zip(seqs, logprobs)
    ]


def distinct(P, rng, length=12):
    return [list(rng.integers(0, 5000, size=length)) for _ in range(P)]


def accounted(sel, P):
    assert len(sel.kept) + sum(sel.dropped.values()) == P
    assert len(set(sel.kept)) == len(sel.kept)


def test_off_keeps_everything():
    rng = np.random.default_rng(0)
    sel = select(samples_from(distinct(64, rng)), 64, common_pb2.ExploreParams())
    assert sel.kept == list(range(64)) and sel.dropped == {}
    assert 0.8 < sel.stats["explore/pdi"] <= 1.0


def test_keep_one_collapses_identical_paths():
    rng = np.random.default_rng(1)
    seqs = distinct(10, rng) + [[7, 7, 8, 9, 10, 11]] * 30
    sel = select(
        samples_from(seqs), 40, common_pb2.ExploreParams(dedup="keep_one", dedup_threshold=0.8)
    )
    assert len(sel.kept) == 11 and sel.dropped == {"duplicate": 29}
    accounted(sel, 40)


def test_downweight_gives_each_cluster_total_weight_one():
    seqs = [[1, 2, 3, 4]] * 4 + [[9, 8, 7, 6]] * 2 + [[5, 5, 6, 6, 7]]
    sel = select(samples_from(seqs), 7, common_pb2.ExploreParams(dedup="downweight"))
    assert len(sel.kept) == 7
    w = [sel.weights[i] for i in sel.kept]
    assert w == pytest.approx([0.25] * 4 + [0.5] * 2 + [1.0])


def test_retention_keeps_at_least_the_ratio_and_the_best_predicted():
    rng = np.random.default_rng(2)
    seqs = distinct(100, rng)
    mean_lp = rng.normal(size=100)
    lps = [[float(m)] * len(s) for m, s in zip(mean_lp, seqs)]
    sel = select(
        samples_from(seqs, lps), 100, common_pb2.ExploreParams(retention=0.6, predictor="logprob")
    )
    assert len(sel.kept) >= 60 and sel.dropped == {"path_filter": 100 - len(sel.kept)}
    kept_min = min(mean_lp[sel.kept])
    dropped = np.setdiff1d(np.arange(100), sel.kept)
    assert max(mean_lp[dropped]) <= kept_min
    accounted(sel, 100)


def test_oversampling_keeps_n_best_and_accounts_for_all():
    rng = np.random.default_rng(3)
    seqs = distinct(200, rng) + [[3, 3, 3, 3]] * 56
    lps = [[float(x)] * len(s) for x, s in zip(rng.normal(size=256), seqs)]
    explore = common_pb2.ExploreParams(
        oversample_m=256, dedup="keep_one", retention=0.8, predictor="logprob"
    )
    sel = select(samples_from(seqs, lps), 64, explore)
    assert len(sel.kept) == 64
    assert set(sel.dropped) == {"duplicate", "path_filter", "oversample"}
    accounted(sel, 256)


def test_reward_model_predictor_is_called_on_prefixes():
    rng = np.random.default_rng(4)
    seqs = distinct(10, rng)
    calls = []

    def scorer(fn, idx, prefix):
        calls.append((fn, list(idx), prefix))
        return np.arange(len(idx), dtype=float)  # later paths score higher

    explore = common_pb2.ExploreParams(
        retention=0.5, predictor="rm_arith", predictor_prefix_tokens=4
    )
    sel = select(samples_from(seqs), 10, explore, scorer)
    assert calls == [("rm_arith", list(range(10)), 4)]
    assert sel.kept == [5, 6, 7, 8, 9]


def test_embedding_dedup_uses_the_local_encoder(tmp_path):
    from tests.unit.services.rollout.explore.test_diversity import _tiny_encoder

    _tiny_encoder(tmp_path)
    texts = ["the answer is 42", "x equals seven", "the answer is 42", "so we get 41"]
    samples = [
        Sample(token_ids=[i, i + 1, i + 2], logprobs=[-1.0] * 3, text=t, finish_reason="stop")
        for i, t in enumerate(texts)
    ]  # token ids all differ: MinHash alone would keep all four
    explore = common_pb2.ExploreParams(
        dedup="keep_one",
        dedup_method="embedding",
        dedup_threshold=0.9999,
        embedding_model=str(tmp_path),
    )
    sel = select(samples, 4, explore)
    assert sel.kept == [0, 1, 3] and sel.dropped == {"duplicate": 1}


def test_embedding_dedup_config_needs_a_model():
    from brorl.errors import InvalidArgument
    from brorl.config.run import parse_run_config

    with pytest.raises(InvalidArgument, match="embedding_model"):
        parse_run_config(
            "model: m\ndata: {train_path: d}\nexplore: {dedup: keep_one, dedup_method: embedding}"
        )
