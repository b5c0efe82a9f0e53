"""Which tokens a top-k / top-p sampler kept: the reference mask and its per-row summary.

Semantics (the learner's since it scored truncated paths; vLLM's ``processed_logprobs`` up to
ties, services/rollout/engine.py), per position, on temperature-scaled logits x (V,):

* top-k (0 < k < V; k <= 0 or k >= V is off): keep x_v >= the k-th largest x. Ties at the
  threshold are all kept, so more than k tokens may survive.
* top-p (p < 1; p >= 1 is off): over the tokens top-k kept, q = softmax(x with the others at
  MASKED). Rank tokens by x descending, ties by the lower vocabulary id first; keep a token while
  the mass ranked strictly above it, ``cumsum(q_sorted) - q_sorted``, is < p (so the first one
  always stays). Ranking by x rather than by q only names *which* of several tokens with equal q
  are cut (softmax is monotone, so the sequence of q values, hence every cut position, is the
  same); it makes ties deterministic where ``sort(q)`` was not.
* the sampled token is always kept: the sampler had it inside its cut-off, and rounding at the
  edge must not mask it.

``truncate_logits_reference`` materialises this on (B, T, V): the oracle and the naive path.
``row_cutoffs`` summarises the same keep set of every row of an (R, V) chunk by two numbers, so
that ``keep_mask`` (a backward pass, a Triton kernel) rebuilds it with comparisons only. Both
cut-offs keep an upper set of the order "x descending, then id ascending": top-k keeps
(x_v, -v) >= (thr, -V), top-p keeps the tokens up to the last one it ranks in, (x*, -v*). Their
intersection is the upper set of the larger bound, (lo, v_lo) = max of the two, so

    keep_v  =  x_v > lo   or  (x_v == lo and v <= v_lo)   or  v = id

with lo = -inf, v_lo = V when neither cut-off is on.
"""

from __future__ import annotations

import torch

# Removed tokens get this finite value rather than -inf (as the learner always did): softmax
# gives them exactly 0 and p * log p stays 0 instead of NaN.
MASKED = -1e9
# top-p looks for its cut among this many largest logits of a row first, then among 32 times as
# many, then sorts the row: a nucleus of an LLM's distribution is usually far smaller than V.
_CANDIDATES = 64


def truncate_logits_reference(
    scaled: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    targets: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scaled logits (B, T, V) with every token outside each path's cut-off set to MASKED.

    top_k (B,) long, top_p (B,) float, targets (B, T) long or None. Plain, vectorised, and
    builds several (B, T, V) temporaries: the test oracle and the naive path, not the learner's.
    """
    B, T, V = scaled.shape
    keep = torch.ones_like(scaled, dtype=torch.bool)  # (B, T, V)
    if bool((top_k > 0).any()):
        k = torch.where(top_k > 0, top_k.clamp(max=V), torch.full_like(top_k, V))  # (B,)
        kth = scaled.topk(int(k.max()), dim=-1).values  # (B, T, kmax)
        threshold = kth.gather(-1, (k - 1)[:, None, None].expand(-1, T, 1))  # (B, T, 1)
        keep &= scaled >= threshold
    use_p = top_p < 1  # (B,)
    if bool(use_p.any()):
        masked = scaled.masked_fill(~keep, MASKED)
        order = masked.argsort(dim=-1, descending=True, stable=True)  # x desc, lower id first
        ranked = masked.softmax(-1).gather(-1, order)  # (B, T, V) probabilities, descending
        above = ranked.cumsum(-1) - ranked  # mass ranked strictly above each token
        keep_ranked = (above < top_p[:, None, None]) | ~use_p[:, None, None]
        keep &= torch.zeros_like(keep).scatter(-1, order, keep_ranked)
    if targets is not None:
        keep.scatter_(-1, targets.unsqueeze(-1), True)
    return scaled.masked_fill(~keep, MASKED)


def row_cutoffs(
    x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, v_lo), each (R,): the lowest kept (x, id) of every row of x (R, V), see above.

    top_k (R,) long and top_p (R,) float are the rows' settings. Temporaries are (R, V): the
    caller bounds R. The probabilities and cumulative sums are those of
    ``truncate_logits_reference`` row by row (same ops), so the cuts fall where its cuts fall.
    """
    R, V = x.shape
    lo = torch.full((R,), float("-inf"), dtype=x.dtype, device=x.device)
    v_lo = torch.full((R,), V, dtype=torch.long, device=x.device)
    use_k = (top_k > 0) & (top_k < V)  # (R,)
    use_p = top_p < 1  # (R,)
    any_k, any_p = bool(use_k.any()), bool(use_p.any())
    if not (any_k or any_p):
        return lo, v_lo
    k = torch.where(use_k, top_k, torch.ones_like(top_k))  # (R,), 1 where off
    K = min(V, max(int(k.max()), _CANDIDATES if any_p else 1))
    vals, idx = x.topk(K, dim=-1)  # (R, K), descending; tie order among equal x unspecified
    if any_k:  # top-k's bound (thr, V): every tie of the threshold stays
        lo = torch.where(use_k, vals.gather(-1, (k - 1)[:, None]).squeeze(-1), lo)
    if not any_p:
        return lo, v_lo
    # -inf rather than the reference's MASKED: both give exactly 0, and exp(-inf) is faster
    q = x.masked_fill(x < lo[:, None], float("-inf")).softmax(-1)  # (R, V): reference's q
    # The sequence of q (and of x) in rank order does not depend on how ties are ordered, so
    # neither do the counts; idx only has to list the K largest.
    n, x_star, nxt = _top_p_cut(vals, q.gather(-1, idx), top_p)  # (R,) each
    more = use_p & (n == K)  # every candidate kept: the cut may lie further down the row
    if K < V and bool(more.any()):
        more &= torch.count_nonzero(x >= lo[:, None], dim=-1) > K  # unless top-k kept <= K
    while K < V and bool(more.any()):
        K = V if K * 128 > V else K * 32  # 64, 2048, then the whole row (a sort)
        rows = more.nonzero().squeeze(1)
        vals, idx = x[rows].topk(K, dim=-1)  # (R', K)
        cut = _top_p_cut(vals, q[rows].gather(-1, idx), top_p[rows])
        n[rows], x_star[rows], nxt[rows] = cut
        more[rows] = cut[0] == K
    # top-p binds where its last kept token ranks at or below top-k's bound (thr, -V)
    binds = use_p & (x_star >= lo)
    v_star = torch.full_like(v_lo, V)
    partial = binds & (nxt == x_star)  # the cut splits a run of equal x: find its last id
    if bool(partial.any()):
        rows = partial.nonzero().squeeze(1)
        v_star[rows] = _last_kept_tie(x[rows], x_star[rows], n[rows])
    return torch.where(binds, x_star, lo), torch.where(binds, v_star, v_lo)


def _top_p_cut(vals: torch.Tensor, ranked: torch.Tensor, top_p: torch.Tensor):
    """(n, x_star, next), each (R,): how many leading ranked tokens top-p keeps, the x of the
    last kept one and of the one ranked after it (-inf if none). vals (R, K) x descending,
    ranked (R, K) their probabilities.

    ``above`` never decreases along a row (the cumulative sum of non-negative numbers does not,
    and subtracting a non-increasing q keeps it so), so the kept tokens are a prefix.
    """
    above = ranked.cumsum(-1) - ranked  # (R, K) mass ranked strictly above each token
    n = torch.count_nonzero(above < top_p[:, None], dim=-1)  # (R,) >= 1
    padded = torch.nn.functional.pad(vals, (0, 1), value=float("-inf"))  # (R, K + 1)
    return n, vals.gather(-1, (n - 1)[:, None]).squeeze(-1), padded.gather(-1, n[:, None])[:, 0]


def _last_kept_tie(x: torch.Tensor, x_star: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """The id of the last kept token equal to x_star in each row of x (R', V): ties are ranked
    by id, and the cut keeps n - #(x > x_star) of them."""
    wanted = n - torch.count_nonzero(x > x_star[:, None], dim=-1)  # (R',) >= 1
    seen = (x == x_star[:, None]).cumsum(-1)  # (R', V): ties met up to each id
    return torch.count_nonzero(seen < wanted[:, None], dim=-1)  # id of the wanted-th tie


def keep_mask(x: torch.Tensor, lo: torch.Tensor, v_lo: torch.Tensor, ids: torch.Tensor):
    """(R, V) bool: the tokens the cut-offs (row_cutoffs) keep, plus each row's sampled id."""
    if bool((v_lo < x.shape[-1]).any()):  # a cut inside a run of ties: the ids decide
        cols = torch.arange(x.shape[-1], device=x.device)  # (V,)
        keep = (x > lo[:, None]) | ((x == lo[:, None]) & (cols <= v_lo[:, None]))
    else:
        keep = x >= lo[:, None]
    return keep.scatter_(-1, ids[:, None], True)
