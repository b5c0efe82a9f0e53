"""Importance ratios of the policy loss, per token or per path, and truncated importance
weights for stale paths (pure tensors; docs/algorithms.md "Loss options").

``train.ratio_level``, for path i with completion mask m (1 on its tokens):

    token     r_it = exp(logp_it - old_it)                                   (PPO / GRPO)
    sequence  s_i  = exp(sum_t m_it (logp_it - old_it) / sum_t m_it)         (GSPO)

The sequence ratio is the geometric mean of the path's token ratios and is clipped per path.
The fused loss (``kernels.clipped_policy_loss``) forms its ratio per token as exp(logp - old);
it is handed the sequence ratio through the baseline ``old'_it = sg[logp_it] - sg[log s_i]``,
so its ratio equals s_i in value with d ratio / d logp_it = s_i: GSPO-token's
sg[s_i] * pi_it / sg[pi_it]. Broadcasting path i's clipped term to its tokens and taking the
step's token mean (the aggregation every estimator shares, estimators.loss_denominator) then
gives exactly the gradient of the reference below, which differentiates through s_i itself.

Truncated IS (``off_policy="tis"``): w = min(pi_learner / pi_sampling, tis_cap), per token, or
with ``ratio_level="sequence"`` one weight per path from the same geometric mean.

Shapes: B paths, T completion positions. Masked positions may hold anything (padding); they
never reach a result.
"""

from __future__ import annotations

from typing import Literal

import torch

from kernels import kl_estimate

RatioLevel = Literal["token", "sequence"]


def sequence_log_ratio(logp, old_logp, mask) -> torch.Tensor:
    """(B,) mean over each path's tokens of logp - old_logp (0 for a path without tokens)."""
    valid = mask != 0  # (B, T)
    diff = torch.where(valid, logp - old_logp, 0.0)  # (B, T): padding may hold inf/nan
    return diff.sum(-1) / valid.sum(-1).clamp(min=1)


def ratio_baseline(logp, old_logp, mask, level: RatioLevel) -> torch.Tensor:
    """(B, T) detached log-probs the fused loss takes its ratio against: ``old_logp`` itself
    (token level), or sg[logp] - sg[log s_i] on every token of path i (sequence level)."""
    if level == "token":
        return old_logp.detach()
    if level != "sequence":
        raise ValueError(f"ratio_level must be 'token' or 'sequence', got {level!r}")
    seq = sequence_log_ratio(logp.detach(), old_logp.detach(), mask)  # (B,)
    return logp.detach() - seq[:, None]


def tis_weight(logp, sampling_logp, mask, cap: float, level: RatioLevel) -> torch.Tensor:
    """(B, T) detached truncated importance weight min(pi / pi_sampling, cap), 0 on padding;
    per token, or per path (the geometric mean ratio) at sequence level."""
    lp, sp = logp.detach(), sampling_logp.detach()
    if level == "sequence":
        log_w = sequence_log_ratio(lp, sp, mask)[:, None].expand_as(lp)  # (B, T)
    elif level == "token":
        log_w = torch.where(mask != 0, lp - sp, 0.0)
    else:
        raise ValueError(f"ratio_level must be 'token' or 'sequence', got {level!r}")
    return torch.exp(log_w).clamp(max=cap) * (mask != 0)


# ---- float64 twins, written independently (test oracle) -------------------------------------


def tis_weight_reference(logp, sampling_logp, mask, cap: float, level: RatioLevel):
    """Plain Python over rows and tokens: a list of rows of weights."""
    out = []
    for b in range(logp.shape[0]):
        toks = [t for t in range(logp.shape[1]) if mask[b, t]]
        diffs = {t: float(logp[b, t]) - float(sampling_logp[b, t]) for t in toks}
        if level == "sequence" and toks:
            mean = sum(diffs.values()) / len(toks)
            diffs = {t: mean for t in toks}
        row = [0.0] * logp.shape[1]
        for t in toks:
            row[t] = min(2.718281828459045 ** diffs[t], cap)
        out.append(row)
    return out


def sequence_policy_loss_reference(
    logp,
    old_logp,
    advantages,
    mask,
    eps_low=0.2,
    eps_high=0.2,
    ref_logp=None,
    kl_coef=0.0,
    kl_estimator="k3",
    path_weight=None,
) -> torch.Tensor:
    """GSPO's loss, path by path, differentiating through s_i: each path adds
    n_i * w_i * -min(s_i A_i, clip(s_i) A_i) and kl_coef * its tokens' KL; the sum is divided
    by the step's token count. ``path_weight``: (B,) per-path TIS weights (or None)."""
    total = logp.new_zeros(())
    tokens = 0
    for b in range(logp.shape[0]):
        keep = mask[b] != 0
        n = int(keep.sum())
        if n == 0:
            continue
        tokens += n
        s = torch.exp((logp[b][keep] - old_logp[b][keep].detach()).mean())
        a = advantages[b].detach()
        clipped = torch.clamp(s, 1 - eps_low, 1 + eps_high)
        term = -torch.min(s * a, clipped * a) * n
        if path_weight is not None:
            term = term * float(path_weight[b])
        total = total + term
        if ref_logp is not None:
            kl = kl_estimate(logp[b][keep], ref_logp[b][keep].detach(), kl_estimator)
            total = total + kl_coef * kl.sum()
    return total / max(tokens, 1)
