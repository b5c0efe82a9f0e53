"""Probe mass: how one update moves the policy's probability of known correct answers.

BroRL's mass-balance argument says that with a wide group (large N) an update raises the
probability mass of correct answers reliably, while with a small N the unsampled tokens'
share of the update can push it down. This module measures that directly, on a fixed probe
set of prompts with known correct answers:

    m_i = log pi(answer_i + <eos> | prompt_i)      (teacher-forced, temperature 1, the whole
                                                    answer sequence; the raw model, no top-k/p)

measured on the learner's own model before and after an update (``answer_logprobs``), and
summarised per update by ``mass_change``:

* ``probe/fell_fraction``: fraction of probes whose m_i went down (BroRL predicts it falls
  toward 0 as N grows);
* ``probe/mean_change``: mean of m_after - m_before (nats);
* ``probe/mean_prob_change``: mean of exp(m_after) - exp(m_before) (probability units);
* ``probe/mean_logprob``: mean m_after (where the probes stand).

Measured every ``probe.every`` updates, the change spans that many updates.
Shapes: B probes in a chunk, T tokens (prompt + answer, right-padded), V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Probe:
    prompt_ids: tuple[int, ...]
    answer_ids: tuple[int, ...]  # the correct answer's tokens, then <eos>


def probes_from(rows, tokenizer) -> list[Probe]:
    """Probes from prompt-set rows (``services.learner.feed.prompts.Prompt``: text, reference); the
    prompt is tokenized as the rollout engine does (the tokenizer's own special tokens), the
    answer without them, followed by the tokenizer's <eos>."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the probe metric needs a tokenizer with an eos token")
    probes = []
    for i, row in enumerate(rows):
        prompt = tokenizer(row.text)["input_ids"]
        answer = tokenizer(row.reference, add_special_tokens=False)["input_ids"]
        if not prompt or not answer:
            raise ValueError(f"probe {i}: empty prompt or reference after tokenization")
        probes.append(Probe(tuple(prompt), tuple(answer) + (eos,)))
    return probes


def sequence_logprob(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor):
    """Sum over t of log softmax(logits[b, t])[targets[b, t]] where mask[b, t] is 1.

    logits (B, T, V) already aligned with targets (B, T) (row t predicts targets[:, t]);
    mask (B, T) float. Returns (B,) in float32."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return (picked * mask).sum(-1)  # (B,)


def sequence_logprob_reference(logits, targets, mask) -> torch.Tensor:
    """Float64 twin of ``sequence_logprob``, one row and one position at a time."""
    logits = logits.double()
    out = torch.zeros(logits.shape[0], dtype=torch.float64)  # (B,)
    for b in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            if mask[b, t]:
                row = logits[b, t]  # (V,)
                out[b] += row[targets[b, t]] - torch.logsumexp(row, dim=0)
    return out


def probe_batch(probes: list[Probe], pad_id: int):
    """(ids (B, T), attention (B, T), targets (B, T), mask (B, T)) for teacher forcing: ids are
    prompt + answer right-padded; targets[:, t] is the token at t + 1 where it is an answer
    token (mask 1), so logits[:, t] scores it."""
    width = max(len(p.prompt_ids) + len(p.answer_ids) for p in probes)
    ids = torch.full((len(probes), width), pad_id, dtype=torch.long)  # (B, T)
    attention = torch.zeros((len(probes), width), dtype=torch.long)  # (B, T)
    targets = torch.full((len(probes), width), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(probes), width))  # (B, T)
    for b, p in enumerate(probes):
        seq = list(p.prompt_ids) + list(p.answer_ids)
        k = len(p.prompt_ids)
        ids[b, : len(seq)] = torch.tensor(seq)
        attention[b, : len(seq)] = 1
        targets[b, k - 1 : len(seq) - 1] = torch.tensor(p.answer_ids)
        mask[b, k - 1 : len(seq) - 1] = 1.0
    return ids, attention, targets, mask


@torch.no_grad()
def answer_logprobs(model, probes: list[Probe], pad_id: int, chunk: int = 64) -> list[float]:
    """m_i for every probe under ``model`` (a causal LM returning ``.logits``), in eval mode
    (no dropout); the model's train/eval mode is restored afterwards."""
    was_training = model.training
    model.eval()
    out: list[float] = []
    try:
        for start in range(0, len(probes), chunk):
            ids, attention, targets, mask = probe_batch(probes[start : start + chunk], pad_id)
            logits = model(input_ids=ids, attention_mask=attention).logits  # (B, T, V)
            out.extend(sequence_logprob(logits, targets, mask).tolist())
    finally:
        model.train(was_training)
    return out


def mass_change(before: list[float], after: list[float]) -> dict[str, float]:
    """The ``probe/*`` metrics of one measurement (module docstring) from m before and after."""
    if len(before) != len(after) or not before:
        raise ValueError(f"need equal, non-empty lists, got {len(before)} and {len(after)}")
    deltas = [a - b for b, a in zip(before, after)]
    k = len(deltas)
    return {
        "probe/fell_fraction": sum(d < 0 for d in deltas) / k,
        "probe/mean_change": math.fsum(deltas) / k,
        "probe/mean_prob_change": math.fsum(
            math.exp(a) - math.exp(b) for b, a in zip(before, after)
        )
        / k,
        "probe/mean_logprob": math.fsum(after) / k,
    }


class ProbeMeter:
    """The probe set of a run and its last measurement: ``measure(model)`` returns the change
    since the previous call (empty dict on the first, which only sets the baseline)."""

    def __init__(self, probes: list[Probe], pad_id: int):
        self.probes, self.pad_id = probes, pad_id
        self.last: list[float] | None = None

    @classmethod
    def for_run(cls, path: str, model_dir: str, pad_id: int) -> "ProbeMeter":
        """The probes of ``path`` (checked like a prompt set), tokenized with the tokenizer of
        ``model_dir`` (the policy's, as the rollout engine loads it)."""
        from transformers import AutoTokenizer

        from services.learner.feed.prompts import load_prompts

        rows = load_prompts(path, field="probe.path")
        return cls(probes_from(rows, AutoTokenizer.from_pretrained(model_dir)), pad_id)

    def measure(self, model) -> dict[str, float]:
        now = answer_logprobs(model, self.probes, self.pad_id)
        before, self.last = self.last, now
        return {} if before is None else mass_change(before, now)
