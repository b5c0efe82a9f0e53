"""services/rollout/explore/diversity.py against pure-Python references (sets of n-gram tuples,
big-int modular arithmetic, all-pairs union-find) on irregular group sizes."""

from __future__ import annotations

import numpy as np
import pytest

from services.rollout.explore import diversity as d


def grams(seq, n=3):
    """Reference n-gram set: whole sequence as one gram when shorter than n."""
    if not seq:
        return set()
    if len(seq) < n:
        return {tuple(seq)}
    return {tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)}


def jaccard(a, b, n=3):
    ga, gb = grams(a, n), grams(b, n)
    return len(ga & gb) / len(ga | gb) if ga | gb else 1.0


def families(rng, n_fam, P, length=64, max_edits=2, vocab=1000):
    """P paths, each a copy of one of n_fam random bases with ≤ max_edits tokens changed near the
    end."""
    bases = [rng.integers(0, vocab, length).tolist() for _ in range(n_fam)]
    fam = rng.integers(0, n_fam, P)
    seqs = []
    for f in fam:
        s = list(bases[f])
        for _ in range(rng.integers(0, max_edits + 1)):
            s[rng.integers(length - 4, length)] = int(rng.integers(0, vocab))
        seqs.append(s)
    return seqs, fam


def brute_force_clusters(seqs, threshold=0.8, **kw):
    """Reference: estimated similarity of every pair, Python union-find, first-appearance ids."""
    sig = d.minhash_signatures(seqs, **kw)  # (P, K)
    equal = sum((col[:, None] == col[None, :]).astype(np.int32) for col in sig.T)  # (P, P)
    parent = list(range(len(seqs)))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for i, j in zip(*np.nonzero(np.triu(equal / sig.shape[1] >= threshold, k=1))):
        ri, rj = find(int(i)), find(int(j))
        parent[max(ri, rj)] = min(ri, rj)
    ids, out = {}, []
    for i in range(len(seqs)):
        out.append(ids.setdefault(find(i), len(ids)))
    return np.array(out)


def same_partition(a, b):
    return np.array_equal(a[:, None] == a[None, :], b[:, None] == b[None, :])


def test_gram_hashes_equal_exactly_when_grams_equal():
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 4, rng.integers(0, 9)).tolist() for _ in range(200)] + [[-1, 2**40, 7]]
    hashes, per_path = d._gram_hashes(seqs, 3)
    ref = [g for s in seqs for g in _ordered_grams(s)]
    assert per_path.tolist() == [len(_ordered_grams(s)) for s in seqs]
    assert len(ref) == hashes.size
    by_gram = {}
    for g, h in zip(ref, hashes.tolist()):
        assert by_gram.setdefault(g, h) == h
    assert len(set(by_gram.values())) == len(
        by_gram
    )  # distinct grams (incl. short ones) never collide here


def _ordered_grams(seq, n=3):
    if not seq:
        return []
    if len(seq) < n:
        return [tuple(seq)]
    return [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]


def test_minhash_matches_big_int_reference():
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, 50000, rng.integers(0, 40)).tolist() for _ in range(37)] + [
        [5],
        [5, 6],
        [],
    ]
    sig = d.minhash_signatures(seqs, n=3, num_perm=16, seed=7)
    assert sig.shape == (40, 16) and sig.dtype == np.uint64
    hashes, per_path = d._gram_hashes(seqs, 3)
    a, b = d._perm_params(16, 7)
    p = (1 << 32) - 5
    start = 0
    for row, count in zip(sig, per_path.tolist()):
        xs = [int(h) % p for h in hashes[start : start + count]]
        start += count
        ref = [
            min((int(ak) * x + int(bk)) % p for x in xs) if xs else int(d.EMPTY_SLOT)
            for ak, bk in zip(a, b)
        ]
        assert row.tolist() == ref


def test_minhash_estimates_jaccard():
    rng = np.random.default_rng(2)
    base = rng.integers(0, 300, 60).tolist()
    seqs = [base] + [base[:k] + rng.integers(0, 300, 60 - k).tolist() for k in (55, 45, 30, 15, 0)]
    sig = d.minhash_signatures(seqs, num_perm=256)
    for i in range(1, len(seqs)):
        est = (sig[0] == sig[i]).mean()
        assert abs(est - jaccard(seqs[0], seqs[i])) < 0.12


def test_minhash_edge_cases_and_seed():
    assert d.minhash_signatures([]).shape == (0, 64)
    sig = d.minhash_signatures([[], [1, 2], [], [1, 2]])
    assert (sig[0] == d.EMPTY_SLOT).all() and np.array_equal(sig[0], sig[2])
    assert np.array_equal(sig[1], sig[3]) and not (sig[1] == sig[0]).any()
    s0 = d.minhash_signatures([[1, 2, 3, 4]], seed=0)
    assert np.array_equal(s0, d.minhash_signatures([np.array([1, 2, 3, 4])], seed=0))
    assert not np.array_equal(s0, d.minhash_signatures([[1, 2, 3, 4]], seed=1))
    with pytest.raises(ValueError):
        d.minhash_signatures([[1]], n=0)


def test_identical_paths_collapse_and_different_survive():
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 1000, 32).tolist(), rng.integers(0, 1000, 32).tolist()
    seqs = [a, b, a, a, b, rng.integers(0, 1000, 32).tolist()]
    ids = d.near_duplicate_clusters(seqs)
    assert ids.tolist() == [0, 1, 0, 0, 1, 2]
    assert d.dedup(ids, "keep_one").tolist() == [1, 1, 0, 0, 0, 1]


def test_clusters_match_all_pairs_reference_p1023():
    rng = np.random.default_rng(4)
    seqs, fam = families(rng, 6, 1000)
    seqs += (
        [[] for _ in range(5)]
        + [[7], [7], [8]]
        + [rng.integers(0, 1000, 40).tolist() for _ in range(15)]
    )
    ids = d.near_duplicate_clusters(seqs)
    assert ids.shape == (1023,) and ids.dtype == np.int64
    assert same_partition(ids, brute_force_clusters(seqs))
    assert same_partition(ids[:1000], fam)  # the near-duplicate families, exactly
    assert ids.max() + 1 == 6 + 1 + 2 + 15
    _, first = np.unique(ids, return_index=True)
    assert np.all(np.diff(first) > 0) and ids[0] == 0  # numbered by first appearance


def test_clusters_large_near_duplicate_buckets_beyond_pair_budget():
    rng = np.random.default_rng(5)
    seqs, fam = families(rng, 2, 1024, length=48, max_edits=1, vocab=50000)
    assert same_partition(d.near_duplicate_clusters(seqs), fam)


def test_clusters_small_and_invalid():
    assert d.near_duplicate_clusters([]).shape == (0,)
    assert d.near_duplicate_clusters([[1, 2, 3]]).tolist() == [0]
    assert d.near_duplicate_clusters([[]]).tolist() == [0]
    assert d.near_duplicate_clusters([[], [1, 2, 3], []]).tolist() == [0, 1, 0]
    with pytest.raises(ValueError, match="bands"):
        d.near_duplicate_clusters([[1, 2, 3]], num_perm=64, bands=10)
    with pytest.raises(ValueError):
        d.near_duplicate_clusters([[1, 2, 3]], threshold=1.5)


def test_dedup_modes():
    ids = np.array([2, 0, 2, 2, 5, 0])
    assert d.dedup(ids, "keep_one").tolist() == [1, 1, 0, 0, 1, 0]
    w = d.dedup(ids, "downweight")
    assert np.allclose(w, [1 / 3, 1 / 2, 1 / 3, 1 / 3, 1, 1 / 2])
    for c in np.unique(ids):
        assert w[ids == c].sum() == pytest.approx(1.0)
    assert d.dedup(ids, "off").tolist() == [1.0] * 6
    assert d.dedup(np.array([], dtype=np.int64), "keep_one").shape == (0,)
    with pytest.raises(ValueError, match="keep_one, downweight, off"):
        d.dedup(ids, "drop")


def test_path_diversity_index():
    rng = np.random.default_rng(6)
    path = rng.integers(0, 32000, 32).tolist()
    assert d.path_diversity_index([path] * 1024) == 0.0
    assert d.path_diversity_index([path]) == 0.0 and d.path_diversity_index([]) == 0.0
    rand = [rng.integers(0, 32000, 32).tolist() for _ in range(1024)]
    assert d.path_diversity_index(rand) > 0.8
    assert d.path_diversity_index(rand, seed=3) == d.path_diversity_index(rand, seed=3)
    few = [
        path,
        path[:16] + rng.integers(0, 32000, 16).tolist(),
        rng.integers(0, 32000, 32).tolist(),
    ]
    ref = np.mean([1 - jaccard(few[i], few[j]) for i, j in ((0, 1), (0, 2), (1, 2))])
    assert abs(d.path_diversity_index(few, num_perm=256) - ref) < 0.1
    half = [path] * 50 + rand[:50]  # 1225 of the 4950 pairs are identical, the rest disjoint
    assert d.path_diversity_index(half) == pytest.approx(1 - 1225 / 4950, abs=0.01)


def equal_slot_pairs_reference(sig: np.ndarray) -> int:
    """equal_slot_pairs' twin: every pair compared, slot by slot."""
    P = sig.shape[0]
    return sum(int((sig[i] == sig[j]).sum()) for i in range(P) for j in range(i + 1, P))


@pytest.mark.parametrize("P, K, values", [(0, 3, 2), (1, 5, 2), (2, 1, 1), (3, 7, 2), (37, 5, 3),
                                          (101, 64, 40), (64, 1, 1000)])  # fmt: skip
def test_equal_slot_pairs_matches_the_pairwise_count(P, K, values):
    sig = np.random.default_rng(P * 100 + K).integers(0, values, size=(P, K)).astype(np.uint64)
    assert d.equal_slot_pairs(sig) == equal_slot_pairs_reference(sig)


def test_unique_ngram_ratio_and_length_stats():
    rng = np.random.default_rng(7)
    seqs = [rng.integers(0, 3, rng.integers(0, 12)).tolist() for _ in range(101)]
    all_grams = [g for s in seqs for g in _ordered_grams(s)]
    assert d.unique_ngram_ratio(seqs) == pytest.approx(len(set(all_grams)) / len(all_grams))
    assert d.unique_ngram_ratio([[1, 2, 3, 4]] * 4) == pytest.approx(0.25)
    assert d.unique_ngram_ratio([[], []]) == 0.0 and d.unique_ngram_ratio([]) == 0.0
    stats = d.length_stats([[0] * k for k in range(11)])  # lengths 0..10
    assert stats == {"mean": 5.0, "p10": 1.0, "p50": 5.0, "p90": 9.0, "max": 10.0}
    assert d.length_stats([])["max"] == 0.0


def _tiny_encoder(path):
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    vocab = {
        t: i for i, t in enumerate(["[PAD]", "[UNK]", *"abcdefghijklmnopqrstuvwxyz0123456789 "])
    }
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", model_max_length=64
    ).save_pretrained(path)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    BertModel(config).save_pretrained(path)


def test_embedding_clusters_with_local_tiny_bert(tmp_path):
    _tiny_encoder(tmp_path)
    texts = [
        "the answer is 42",
        "x equals seven",
        "the answer is 42",
        "",
        "so we get 41",
        "x equals seven",
        "",
        "the answer is 43",
    ]
    ids = d.embedding_clusters(texts, str(tmp_path), threshold=0.9999, batch_size=3)
    assert ids.tolist() == [0, 1, 0, 2, 3, 1, 2, 4]
    assert d.embedding_clusters(texts[:1], str(tmp_path)).tolist() == [0]
    assert d.embedding_clusters([], str(tmp_path)).shape == (0,)
    assert d.embedding_clusters(texts, str(tmp_path), threshold=-1.0).tolist() == [0] * len(texts)


def test_embedding_clusters_needs_local_directory(tmp_path):
    with pytest.raises(ValueError, match="local model path"):
        d.embedding_clusters(["a"], "bert-base-uncased")
    with pytest.raises(ValueError, match="local model path"):
        d.embedding_clusters(["a"], str(tmp_path / "missing"))
