"""The policy loss of one micro-batch: log-probs under the current weights at the sampling
temperature (kernels.token_logprobs_entropy), then the clipped surrogate (kernels)."""

from __future__ import annotations

import torch

from kernels import clipped_policy_loss, token_logprobs_entropy
from services.learner.batch import Batch
from services.learner.forward import completion_logits


# Masked logits are set to this finite value rather than -inf: softmax gives them exactly 0 in
# fp32 and the entropy term p*log p stays 0 instead of NaN.
MASKED = -1e9


def truncate_logits(
    scaled: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    targets: torch.Tensor | None = None,
) -> torch.Tensor:
    """Apply each row's top-k / top-p cut-off to temperature-scaled logits (B, T, V), as the
    sampler did, so the learner's log-probs are of the distribution the paths came from."""
    V = scaled.shape[-1]
    keep = torch.ones_like(scaled, dtype=torch.bool)
    if bool((top_k > 0).any()):
        k = torch.where(top_k > 0, top_k.clamp(max=V), torch.full_like(top_k, V))  # (B,)
        kth = scaled.topk(int(k.max()), dim=-1).values  # (B, T, kmax)
        threshold = kth.gather(
            -1, (k - 1)[:, None, None].expand(-1, scaled.shape[1], 1)
        )  # (B, T, 1)
        keep &= scaled >= threshold
    if bool((top_p < 1).any()):
        masked = scaled.masked_fill(~keep, MASKED)
        probs, order = masked.softmax(-1).sort(-1, descending=True)  # (B, T, V)
        # keep a token while the mass ranked strictly above it is below top_p
        above = probs.cumsum(-1) - probs
        keep_sorted = above < top_p[:, None, None]
        keep &= torch.zeros_like(keep).scatter(-1, order, keep_sorted)
    if targets is not None:
        # the sampled token was inside the sampler's cut-off; rounding at the edge must not mask it
        keep.scatter_(-1, targets.unsqueeze(-1), True)
    return scaled.masked_fill(~keep, MASKED)


def token_logprobs(model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) log-probs of the batch's targets and (B, T) entropies under each path's sampling
    distribution: temperature, then the same top-k / top-p cut-off. T: completion positions."""
    logits = completion_logits(model, batch)  # (B, T, V)
    temps = batch.temperature
    truncated = bool((batch.top_k > 0).any() or (batch.top_p < 1).any())
    if not truncated and bool((temps == temps[0]).all()):
        return token_logprobs_entropy(logits, batch.targets, temperature=float(temps[0]))
    scaled = logits / temps[:, None, None]
    if truncated:
        scaled = truncate_logits(scaled, batch.top_k, batch.top_p, batch.targets)
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
