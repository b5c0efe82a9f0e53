"""The policy loss of one micro-batch: log-probs under the current weights at the sampling
temperature and cut-offs (kernels.token_logprobs_entropy, kernels.truncated_logprobs_entropy),
then the clipped surrogate (kernels)."""

from __future__ import annotations

import torch

from kernels import clipped_policy_loss, token_logprobs_entropy, truncated_logprobs_entropy
from services.learner.batch import Batch
from services.learner.forward import completion_logits


def token_logprobs(model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) log-probs of the batch's targets and (B, T) entropies under each path's sampling
    distribution: temperature, then the same top-k / top-p cut-off. T: completion positions."""
    logits = completion_logits(model, batch)  # (B, T, V)
    temps = batch.temperature
    truncated = bool((batch.top_k > 0).any() or (batch.top_p < 1).any())
    if truncated:  # chunked over positions: no (B, T, V) temporaries (kernels.cutoffs: the rule)
        return truncated_logprobs_entropy(logits, batch.targets, temps, batch.top_k, batch.top_p)
    if bool((temps == temps[0]).all()):
        return token_logprobs_entropy(logits, batch.targets, temperature=float(temps[0]))
    scaled = logits / temps[:, None, None]
    return token_logprobs_entropy(scaled, batch.targets, temperature=1.0)


def policy_loss(
    model, batch: Batch, train, ref_model=None
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss (token mean over the micro-batch) and detached statistics.

    off_policy="clip": ratio = π_θ / π_sampling, clipped to [1-clip_low, 1+clip_high] — the
    clip is the importance correction for stale paths. off_policy="tis": ratio against the
    learner's own recomputed log-probs (on-policy PPO) times a truncated importance weight
    min(π_θ / π_sampling, tis_cap).
    """
    logp, entropy = token_logprobs(model, batch)  # (B, T), (B, T)
    ref_logp = None
    if ref_model is not None and train.kl_coef > 0:
        with torch.no_grad():
            ref_logp, _ = token_logprobs(ref_model, batch)
    mask = batch.loss_mask
    tis_weight = None
    if train.off_policy == "tis":
        old_logp = logp.detach()
        tis_weight = torch.exp(old_logp - batch.sampling_logp).clamp(max=train.tis_cap) * mask
    else:
        old_logp = batch.sampling_logp
    loss, stats = clipped_policy_loss(
        logp,
        old_logp,
        batch.advantages,
        mask,
        eps_low=train.clip_low,
        eps_high=train.clip_high,
        ref_logp=ref_logp,
        kl_coef=train.kl_coef,
        kl_estimator=train.kl_estimator,
        tis_weight=tis_weight,
    )
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        out = {k: float(v) for k, v in stats.items()}
        out["entropy"] = float((entropy.detach() * mask).sum() / n)
        out["logp_gap"] = float(((logp.detach() - batch.sampling_logp).abs() * mask).sum() / n)
    return loss, out
