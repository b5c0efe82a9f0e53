"""The policy loss of one micro-batch: log-probs under the current weights at the sampling
temperature and cut-offs (kernels.token_logprobs_entropy, kernels.truncated_logprobs_entropy),
then the clipped surrogate of services/learner/algo/surrogate.py."""

from __future__ import annotations

import torch

from kernels import token_logprobs_entropy, truncated_logprobs_entropy
from services.learner.algo.surrogate import surrogate_loss
from services.learner.model.batch import Batch
from services.learner.model.forward import PromptPass, completion_logits


def token_logprobs(
    model, batch: Batch, prompt: PromptPass | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) log-probs of the batch's targets and (B, T) entropies under each path's sampling
    distribution: temperature, then the same top-k / top-p cut-off. T: completion positions.
    ``prompt``: the group's prompt already run (prompt_once.py); else the chunk runs it."""
    logits = completion_logits(model, batch, prompt)  # (B, T, V)
    temps = batch.temperature
    truncated = bool((batch.top_k > 0).any() or (batch.top_p < 1).any())
    if truncated:  # chunked over positions: no (B, T, V) temporaries (kernels.cutoffs: the rule)
        return truncated_logprobs_entropy(logits, batch.targets, temps, batch.top_k, batch.top_p)
    if bool((temps == temps[0]).all()):
        return token_logprobs_entropy(logits, batch.targets, temperature=float(temps[0]))
    scaled = logits / temps[:, None, None]
    return token_logprobs_entropy(scaled, batch.targets, temperature=1.0)


def policy_loss(
    model,
    batch: Batch,
    train,
    ref_model=None,
    prompt: PromptPass | None = None,
    ref_prompt: PromptPass | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss (token mean over the micro-batch) and detached statistics; the reference model
    runs only when the KL has a weight (``train.kl_coef`` > 0). ``prompt`` / ``ref_prompt``: the
    group's prompt already run by the model / the reference (prompt_once.py)."""
    logp, entropy = token_logprobs(model, batch, prompt)  # (B, T), (B, T)
    ref_logp = None
    if ref_model is not None and train.kl_coef > 0:
        with torch.no_grad():
            ref_logp, _ = token_logprobs(ref_model, batch, ref_prompt)
    return surrogate_loss(logp, entropy, batch, train, ref_logp)
