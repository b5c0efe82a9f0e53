"""The clipped surrogate loss of one micro-batch from its log-probs (pure tensors): the
importance ratio and its correction (importance.py), the KL to the reference as a loss term or
a reward penalty folded into the advantages (advantages.kl_penalised), the fused clipped loss
(kernels.clipped_policy_loss).

Shapes: B paths, T completion positions.
"""

from __future__ import annotations

import torch

from kernels import clipped_policy_loss, kl_estimate
from services.learner.algo import importance
from services.learner.algo.advantages import kl_penalised

MAX_TURN_STATS = 4  # episodes' per-turn statistics are reported for their first turns


def surrogate_loss(logp, entropy, batch, train, ref_logp=None) -> tuple[torch.Tensor, dict]:
    """The loss from the chunk's (B, T) log-probs (pure; options in docs/algorithms.md).
    ``batch`` is a chunk (model/batch.py ``Batch``); its loss_mask, sampling_logp, advantages
    and weight are read.

    off_policy="clip": ratio = π_θ / π_sampling (per token, or per path with
    ratio_level="sequence"), clipped to [1-clip_low, 1+clip_high] — the clip is the importance
    correction for stale paths. off_policy="tis": ratio against the learner's own recomputed
    log-probs (on-policy PPO) times a truncated importance weight min(π_θ / π_sampling,
    tis_cap) (importance.py). off_policy="none": ratio 1, no correction. The KL to
    ``ref_logp`` is a loss term (kl_in="loss") or a per-token reward penalty folded into the
    advantages (kl_in="reward", advantages.kl_penalised).
    """
    mask = batch.loss_mask
    level = train.ratio_level
    tis = None
    if train.off_policy == "tis":
        old_logp = logp.detach()  # ratio 1 at either level: the TIS weight is the correction
        tis = importance.tis_weight(logp, batch.sampling_logp, mask, train.tis_cap, level)
    elif train.off_policy == "none":
        old_logp = logp.detach()  # ratio 1: a stale path counts as if sampled by these weights
    else:
        old_logp = importance.ratio_baseline(logp, batch.sampling_logp, mask, level)
    advantages, kl_ref, reward_kl = batch.advantages, ref_logp, None
    if ref_logp is not None and train.kl_in == "reward":
        reward_kl = kl_estimate(logp.detach(), ref_logp, train.kl_estimator)  # (B, T)
        advantages = kl_penalised(
            advantages, reward_kl, mask, train.kl_coef, batch.weight
        )
        kl_ref = None
    loss, stats = clipped_policy_loss(
        logp,
        old_logp,
        advantages,
        mask,
        eps_low=train.clip_low,
        eps_high=train.clip_high,
        ref_logp=kl_ref,
        kl_coef=train.kl_coef if kl_ref is not None else 0.0,
        kl_estimator=train.kl_estimator,
        tis_weight=tis,
    )
    with torch.no_grad():
        out = {k: float(v) for k, v in stats.items()}
        out.update(_token_stats(logp, entropy, batch, train, tis, reward_kl, level))
    return loss, out


def _token_stats(logp, entropy, batch, train, tis, reward_kl, level) -> dict[str, float]:
    """Masked token means of the chunk (the environment's tokens of episodes excluded): entropy,
    |logp - sampling logp| (per policy turn of episodes too), the KL in the reward, TIS."""
    mask = batch.loss_mask
    valid = mask != 0
    n = mask.sum().clamp(min=1)

    def mean(x):  # masked token mean
        return float(torch.where(valid, x, 0.0).sum() / n)

    out = {"entropy": mean(entropy.detach())}
    gap = (logp.detach() - batch.sampling_logp).abs()  # (B, T)
    out["logp_gap"] = mean(gap)
    turns = getattr(batch, "turns", None)
    if turns is not None:  # episodes: the gap of each policy turn (1..MAX_TURN_STATS)
        for k in range(1, min(int(turns.max()), MAX_TURN_STATS) + 1):
            at = turns == k
            out[f"logp_gap/turn{k}"] = float(torch.where(at, gap, 0.0).sum() / at.sum())
    if reward_kl is not None:
        out["kl"] = mean(reward_kl)  # the measured KL, as kl_in="loss" reports it
    if tis is not None:
        out["tis_weight_mean"] = mean(tis)
        raw = importance.tis_weight(logp, batch.sampling_logp, mask, float("inf"), level)
        out["tis_capped_frac"] = mean((raw > train.tis_cap).float())
    return out
