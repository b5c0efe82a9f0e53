"""Diversity of a wide path group: MinHash near-duplicate clusters, dedup weights and metrics.

Pure numpy functions over token-id paths (no gRPC, no vLLM). Shapes: P paths, G n-grams over
the whole group, K = num_perm MinHash permutations, B bands, U distinct signatures.

Definitions
-----------
* **n-gram set** of a path: the set of its length-``n`` token windows. A non-empty path shorter
  than ``n`` has one gram, its whole sequence; an empty path has no grams.
* **MinHash signature**: each gram is hashed to 64 bits (a murmur3-style mix of its token ids
  and length), reduced to ``x = hash mod p`` with the prime ``p = 2^32 - 5``, and put through K
  universal hashes ``h_k(x) = (a_k*x + b_k) mod p`` (``a_k`` in [1, p), ``b_k`` in [0, p), drawn
  from ``seed``; ``a_k*x + b_k < 2^64`` is exact in uint64, and each ``h_k`` is a permutation of
  Z_p); slot k is the minimum of ``h_k`` over the path's grams.
  An empty path gets the fixed signature ``EMPTY_SLOT`` in every slot (a value no gram reaches),
  so two empty paths are identical and an empty path shares nothing with a non-empty one.
* **Estimated Jaccard similarity** of two paths = fraction of equal signature slots; it is an
  unbiased estimate of |A ∩ B| / |A ∪ B| of their n-gram sets (std ≤ 0.5/sqrt(K)).
* **PDI (path diversity index)** = mean over all pairs of paths of the estimated Jaccard
  *distance* ``1 - similarity``, exact over the pairs (equal slots are counted per slot from the
  sorted column, not pair by pair). In [0, 1]: 0 when every path is the same, near 1 when paths
  share no n-grams; 0 for fewer than 2 paths. Logged as ``explore/pdi``.

Near-duplicate clusters use LSH banding (B bands of K/B rows; two signatures are candidates
when a band matches exactly), confirm a candidate when its estimated similarity ≥ threshold, and
join confirmed pairs with union-find (single linkage). Identical signatures (hence identical
paths) are merged before banding, so identical paths always share a cluster. Band buckets are
compared all-pairs, smallest first, up to ``_PAIR_BUDGET`` pairs; in the remaining (large)
buckets each member is compared with the bucket's first member and its next ``_WINDOW`` members,
which bounds the work at O(_PAIR_BUDGET + P·B·_WINDOW) even when hundreds of paths nearly agree.
"""

from __future__ import annotations

from itertools import chain
from pathlib import Path
from typing import Sequence

import numpy as np

PRIME_32 = np.uint64((1 << 32) - 5)  # largest prime below 2^32
EMPTY_SLOT = np.uint64(np.iinfo(np.uint64).max)  # signature value of an empty path (> any hash)
DEDUP_MODES = ("keep_one", "downweight", "off")
_WINDOW = 8
_CHUNK = 8192
_PAIR_BUDGET = 100_000  # candidate pairs compared all-pairs (over all bands) before windowing
_C1 = np.uint64(0xFF51AFD7ED558CCD)
_C2 = np.uint64(0xC4CEB9FE1A85EC53)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S33 = np.uint64(33)


def _fmix64(z: np.ndarray) -> np.ndarray:
    """murmur3 64-bit finaliser; uint64 arithmetic wraps. (…,) -> (…,)"""
    z = z ^ (z >> _S33)
    z = z * _C1
    z ^= z >> _S33
    z *= _C2
    z ^= z >> _S33
    return z


def _flatten(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """paths -> (flat token ids (T,) int64, lengths (P,) int64)."""
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))  # (P,)
    total = int(lengths.sum())
    if seqs and all(isinstance(s, np.ndarray) for s in seqs):
        flat = (
            np.concatenate([np.asarray(s, dtype=np.int64).ravel() for s in seqs])
            if total
            else np.zeros(0, np.int64)
        )
    else:
        flat = np.fromiter(chain.from_iterable(seqs), dtype=np.int64, count=total)  # (T,)
    return flat, lengths


def _gram_hashes(seqs: Sequence[Sequence[int]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """64-bit hash of every n-gram, grouped by path in order -> (hashes (G,) uint64, grams per path
    (P,) int64)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    flat, lengths = _flatten(seqs)
    per_path = np.where(lengths >= n, lengths - n + 1, (lengths > 0).astype(np.int64))  # (P,)
    G = int(per_path.sum())
    owner = np.repeat(np.arange(len(lengths)), per_path)  # (G,)
    path_start = np.cumsum(lengths) - lengths  # (P,)
    first_gram = np.cumsum(per_path) - per_path  # (P,)
    gram_start = path_start[owner] + (np.arange(G) - first_gram[owner])  # (G,)
    glen = np.minimum(lengths, n)[owner].astype(np.uint64)  # (G,)
    toks = np.concatenate([flat, np.zeros(n, np.int64)]).view(np.uint64)  # (T + n,) padded
    short = bool((lengths < n).any())
    h = np.full(G, _GOLDEN, dtype=np.uint64)  # (G,)
    for j in range(n):
        mixed = _fmix64(h ^ (toks[gram_start + j] * _C2 + np.uint64(j)))
        h = np.where(glen > j, mixed, h) if (short and j) else mixed
    return _fmix64(h ^ glen), per_path


def _perm_params(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Universal hash coefficients (a (K,), b (K,)) uint64, a in [1, p), b in [0, p)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(1, int(PRIME_32), size=num_perm, dtype=np.uint64)
    b = rng.integers(0, int(PRIME_32), size=num_perm, dtype=np.uint64)
    return a, b


def minhash_signatures(
    seqs: Sequence[Sequence[int]], n: int = 3, num_perm: int = 64, seed: int = 0
) -> np.ndarray:
    """MinHash signatures of the paths' n-gram sets -> (P, num_perm) uint64 (see module
    docstring)."""
    if num_perm < 1:
        raise ValueError(f"num_perm must be at least 1, got {num_perm}")
    hashes, per_path = _gram_hashes(seqs, n)  # (G,), (P,)
    a, b = _perm_params(num_perm, seed)  # (K,)
    sig = np.full((len(per_path), num_perm), EMPTY_SLOT, dtype=np.uint64)  # (P, K)
    if hashes.size == 0:
        return sig
    x = hashes % PRIME_32  # (G,) in Z_p
    v = x[:, None] * a[None, :]  # (G, K) ≤ (p-1)^2, exact
    v += b[None, :]  # (G, K) < p^2 < 2^64, exact
    v %= PRIME_32  # (G, K) = (a*x + b) mod p
    nonempty = per_path > 0
    offsets = (np.cumsum(per_path) - per_path)[nonempty]
    sig[nonempty] = np.minimum.reduceat(v, offsets, axis=0)
    return sig


def _components(n: int, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Union-find over edges (u[i], v[i]) by hooking roots and path halving -> root (n,) = smallest
    member."""
    parent = np.arange(n)
    u = np.asarray(u, dtype=np.int64)
    v = np.asarray(v, dtype=np.int64)
    while u.size:
        pu, pv = parent[u], parent[v]
        open_ = pu != pv
        u, v, pu, pv = u[open_], v[open_], pu[open_], pv[open_]
        if not u.size:
            break
        np.minimum.at(
            parent, np.maximum(pu, pv), np.minimum(pu, pv)
        )  # hook larger root under smaller
        while True:  # compress every chain to its root
            grand = parent[parent]
            if np.array_equal(grand, parent):
                break
            parent = grand
    return parent


def _first_appearance_ids(labels: np.ndarray) -> np.ndarray:
    """Arbitrary labels (P,) -> ids 0..C-1 numbered in order of first appearance (P,) int64."""
    if labels.size == 0:
        return np.zeros(0, dtype=np.int64)
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first)] = np.arange(first.size)
    return rank[inverse.reshape(-1)]


def _candidate_pairs(sig: np.ndarray, bands: int) -> tuple[np.ndarray, np.ndarray]:
    """LSH banding over distinct signatures (U, K) -> candidate pairs (u (E,), v (E,)), u < v,
    unique."""
    U, K = sig.shape
    rows = K // bands
    key = np.zeros((U, bands), dtype=np.uint64)  # (U, B)
    banded = sig.reshape(U, bands, rows)
    for r in range(rows):
        key = _fmix64(
            key ^ (banded[:, :, r] + np.uint64((0x9E3779B97F4A7C15 * (r + 1)) & 0xFFFFFFFFFFFFFFFF))
        )
    key = _fmix64(key ^ (np.arange(bands, dtype=np.uint64) * _C1))  # salt each band
    flat = key.T.ravel()  # (B*U,) band-major, path order inside a band
    order = np.argsort(flat, kind="stable")
    members = order % U  # (N,) N = B*U signature indices, sorted by bucket
    sorted_key = flat[order]
    new_bucket = np.ones(flat.size, dtype=bool)
    new_bucket[1:] = sorted_key[1:] != sorted_key[:-1]
    starts = np.flatnonzero(new_bucket)  # (Q,) first position of each bucket
    sizes = np.diff(np.append(starts, flat.size))  # (Q,)
    cost = sizes * (sizes - 1) // 2  # (Q,) pairs inside each bucket
    by_size = np.argsort(sizes, kind="stable")
    full = np.zeros(
        sizes.size, dtype=bool
    )  # (Q,) buckets compared all-pairs: smallest first, within budget
    full[by_size[np.cumsum(cost[by_size]) <= _PAIR_BUDGET]] = True
    pos = np.arange(flat.size)  # (N,)
    bucket_start = np.repeat(starts, sizes)  # (N,)
    rank = pos - bucket_start  # (N,) position inside the bucket
    count = np.where(
        np.repeat(full, sizes), np.repeat(sizes, sizes) - 1 - rank, 0
    )  # (N,) later partners
    src = np.repeat(pos, count)  # (E_full,)
    offset = np.arange(src.size) - np.repeat(np.cumsum(count) - count, count) + 1
    us, vs = [members[src]], [members[src + offset]]
    windowed = ~np.repeat(full, sizes)  # (N,) buckets over budget: star + window
    us.append(members[bucket_start[windowed]])
    vs.append(members[windowed])
    for d in range(1, _WINDOW + 1):  # every member vs its next d-th member in the bucket
        same = (bucket_start[d:] == bucket_start[:-d]) & windowed[d:]
        us.append(members[:-d][same])
        vs.append(members[d:][same])
    u, v = np.concatenate(us), np.concatenate(vs)
    lo, hi = np.minimum(u, v), np.maximum(u, v)
    code = np.unique(lo[lo != hi] * U + hi[lo != hi])
    return code // U, code % U


def near_duplicate_clusters(
    seqs: Sequence[Sequence[int]],
    threshold: float = 0.8,
    n: int = 3,
    num_perm: int = 64,
    bands: int = 16,
    seed: int = 0,
) -> np.ndarray:
    """Near-duplicate cluster id per path (P,) int64, ids 0..C-1 in order of first appearance."""
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    if bands < 1 or num_perm % bands:
        raise ValueError(f"bands must divide num_perm: num_perm={num_perm}, bands={bands}")
    sig = minhash_signatures(seqs, n=n, num_perm=num_perm, seed=seed)  # (P, K)
    if sig.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    uniq, inverse = np.unique(sig, axis=0, return_inverse=True)  # (U, K), (P,)
    u, v = _candidate_pairs(uniq, bands)  # (E,)
    slots = uniq.astype(np.uint32)  # (U, K) lossless: hashes < 2^32 - 5, EMPTY_SLOT -> 2^32 - 1
    keep = np.zeros(u.size, dtype=bool)  # (E,)
    for s in range(0, u.size, _CHUNK):  # chunks keep the (chunk, K) gathers in cache
        equal = np.count_nonzero(slots[u[s : s + _CHUNK]] == slots[v[s : s + _CHUNK]], axis=1)
        keep[s : s + _CHUNK] = equal / num_perm >= threshold
    root = _components(uniq.shape[0], u[keep], v[keep])  # (U,)
    return _first_appearance_ids(root[inverse.reshape(-1)])


def dedup(cluster_ids: np.ndarray, mode: str) -> np.ndarray:
    """Per-path weights (P,) float64: keep_one → 1 for each cluster's first path, 0 else;
    downweight → 1/cluster size (each cluster sums to 1); off → all ones."""
    if mode not in DEDUP_MODES:
        raise ValueError(f"unknown dedup mode {mode!r}; valid modes: {', '.join(DEDUP_MODES)}")
    ids = np.asarray(cluster_ids).reshape(-1)  # (P,)
    if mode == "off" or ids.size == 0:
        return np.ones(ids.size, dtype=np.float64)
    _, first, inverse, counts = np.unique(
        ids, return_index=True, return_inverse=True, return_counts=True
    )
    if mode == "downweight":
        return 1.0 / counts[inverse.reshape(-1)].astype(np.float64)
    weights = np.zeros(ids.size, dtype=np.float64)
    weights[first] = 1.0
    return weights


def path_diversity_index(
    seqs: Sequence[Sequence[int]], n: int = 3, num_perm: int = 64, seed: int = 0
) -> float:
    """PDI in [0, 1]: mean over all pairs of paths of their estimated Jaccard distance."""
    sig = minhash_signatures(seqs, n=n, num_perm=num_perm, seed=seed)  # (P, K)
    P = sig.shape[0]
    if P < 2:
        return 0.0
    return 1.0 - equal_slot_pairs(sig) / (num_perm * (P * (P - 1) // 2))


def equal_slot_pairs(sig: np.ndarray) -> int:
    """Over every slot k, the number of path pairs (i < j) with ``sig[i, k] == sig[j, k]``:
    counted from each column sorted (an element equals the ones before it in its run), in
    O(P log P) a slot instead of a comparison per pair. (P, K) -> int"""
    P = sig.shape[0]
    if P < 2:
        return 0
    ordered = np.sort(sig, axis=0)  # (P, K)
    row = np.arange(P)[:, None]  # (P, 1)
    run_start = np.ones(ordered.shape, dtype=bool)  # (P, K) where a run of equal values starts
    run_start[1:] = ordered[1:] != ordered[:-1]
    first = np.maximum.accumulate(np.where(run_start, row, 0), axis=0)  # (P, K) its run's start
    return int((row - first).sum())


def unique_ngram_ratio(seqs: Sequence[Sequence[int]], n: int = 3) -> float:
    """Distinct n-grams across the group / total n-grams (0 if none); grams compared by 64-bit
    hash."""
    hashes, _ = _gram_hashes(seqs, n)  # (G,)
    return float(np.unique(hashes).size / hashes.size) if hashes.size else 0.0


def length_stats(seqs: Sequence[Sequence[int]]) -> dict[str, float]:
    """Path length statistics: mean, p10, p50, p90, max (all 0.0 for an empty group)."""
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.float64, count=len(seqs))  # (P,)
    if lengths.size == 0:
        return {"mean": 0.0, "p10": 0.0, "p50": 0.0, "p90": 0.0, "max": 0.0}
    p10, p50, p90 = np.percentile(lengths, [10, 50, 90])
    return {
        "mean": float(lengths.mean()),
        "p10": float(p10),
        "p50": float(p50),
        "p90": float(p90),
        "max": float(lengths.max()),
    }


def embedding_clusters(
    texts: Sequence[str], model_path: str, threshold: float = 0.95, batch_size: int = 64
) -> np.ndarray:
    """Semantic clusters (P,) int64 from a LOCAL transformers encoder directory: mean-pooled last
    hidden state, cosine similarity ≥ threshold joins two texts (union-find); identical texts
    always share a cluster. Ids 0..C-1 in order of first appearance. Never downloads."""
    if not Path(model_path).is_dir():
        raise ValueError(
            f"embedding_clusters needs a local model path (a directory with the encoder's "
            f"config, weights and tokenizer); {model_path!r} is not a directory"
        )
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    texts = list(texts)
    P = len(texts)
    if P == 0:
        return np.zeros(0, dtype=np.int64)
    import inspect

    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    model = AutoModel.from_pretrained(model_path, local_files_only=True).eval()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    if tokenizer.pad_token is None:
        raise ValueError(
            f"the tokenizer in {model_path!r} has no pad, eos or unk token to pad batches with"
        )
    max_len = min(
        int(tokenizer.model_max_length), int(getattr(model.config, "max_position_embeddings", 512))
    )
    accepted = set(inspect.signature(model.forward).parameters)
    chunks = []
    with torch.no_grad():
        for s in range(0, P, batch_size):
            enc = tokenizer(
                texts[s : s + batch_size],
                padding=True,
                truncation=True,
                max_length=max_len,
                return_tensors="pt",
            )
            hidden = model(
                **{k: t for k, t in enc.items() if k in accepted}
            ).last_hidden_state  # (b, T, H)
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (b, T, 1)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # (b, H)
            chunks.append(torch.nn.functional.normalize(pooled.float(), dim=-1))
    emb = torch.cat(chunks).numpy()  # (P, H) unit rows
    i, j = np.nonzero(np.triu(emb @ emb.T >= threshold, k=1))  # (E,)
    first_of_text: dict[str, int] = {}
    same_text = np.array([first_of_text.setdefault(t, k) for k, t in enumerate(texts)])  # (P,)
    root = _components(P, np.concatenate([i, same_text]), np.concatenate([j, np.arange(P)]))
    return _first_appearance_ids(root)
