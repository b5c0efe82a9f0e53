"""A group's prompt run once per optimizer step, read by every chunk of the group.

A group's paths are cut into chunks of ``train.micro_batch_paths`` (batch.py) so that a chunk's
activations fit, and each chunk's forward would run the group's prompt again (forward.py). With a
long prompt and small chunks that is much of the update: a 512-token prompt before chunks of 8
paths × 128 tokens is a third of every chunk's positions. Here the prompt runs once:

* the group's first chunk runs the prompt's forward with gradients (``forward.prompt_pass``) and
  keeps its graph; the chunks read its outputs — the last position's output and every layer's
  keys and values — as detached leaves, so a chunk's backward stops at them and leaves its share
  of their gradient in ``.grad``, summed here in float32 (``collect``);
* the group's last chunk reads the attached outputs instead, and its loss gains the surrogate
  Σ ⟨output, summed gradient⟩ (``surrogate``), whose gradient with respect to the weights is the
  earlier chunks' share of the prompt's gradient (the chain rule: d/dθ ⟨o(θ), g⟩ = gᵀ do/dθ). One
  backward then carries the whole group's gradient through the prompt, and the update's backward
  calls stay one per chunk (DeepSpeed's gradient accumulation and reductions see no extra call).

A model read without gradients — the reference model (``train.kl_coef`` > 0), and before the
update the critic's values and the log-probs the token-level estimators read — runs the prompt
once a group too (``no_grad_for``). PPO's critic shares its prompt in training as the policy
does, through a second ``GroupPrompts`` that reads its trunk's hidden states (``read``). A
group with one chunk in the step runs as before (its chunk makes its own prompt pass). The
weights do not change within an optimizer step, so every chunk of a group reads the same prompt
it would have computed.

At ZeRO stages 0 and 1 only (Policy decides): ZeRO-2 counts the parameters' gradient hooks in
each backward to know when to reduce, and a backward that also runs through a forward made for
an earlier chunk breaks its count (DeepSpeed 0.19: an IndexError in its reduction's epilogue,
two ranks); ZeRO-3 gathers the parameters in every forward, a collective the ranks must call
alike.
"""

from __future__ import annotations

from collections import Counter

import torch

from services.learner.model import forward
from services.learner.model.batch import Batch
from services.learner.model.forward import PromptPass


class GroupPrompts:
    """The prompt passes of one optimizer step's chunks, run in the order ``groups`` gives (each
    chunk's group index); ``read`` takes what a chunk reads of the model's output (the policy's
    logits, or the critic trunk's hidden states: forward.hidden_of)."""

    def __init__(self, groups: list[int], enabled: bool = True, read=forward.logits_of):
        self.enabled, self.read = enabled, read
        self._chunks = Counter(groups)  # chunks of each group in this step
        self._last = {g: j for j, g in enumerate(groups)}  # the group's last chunk's place
        self._attached: dict[int, PromptPass] = {}
        self._leaves: dict[int, PromptPass] = {}
        self._summed: dict[int, list[torch.Tensor | None]] = {}
        self._frozen: dict[int, PromptPass] = {}  # passes without gradients (no_grad_for)

    def shared(self, group: int) -> bool:
        """Whether ``group``'s chunks share one prompt pass."""
        return self.enabled and self._chunks[group] > 1

    def prompt_for(self, j: int, model, chunk: Batch) -> PromptPass | None:
        """The prompt pass the ``j``-th chunk reads: the leaves, or at the group's last chunk the
        attached outputs; None where the chunk runs its own (the group's only chunk). Called in
        the chunk's forward context (autocast), whose dtype the pass then has."""
        group = chunk.group_index
        if not self.shared(group):
            return None
        if group not in self._attached:
            attached = forward.prompt_pass(model, chunk.prompt_ids, self.read)
            self._attached[group] = attached
            self._leaves[group] = PromptPass(
                _leaf(attached.first), [(_leaf(k), _leaf(v)) for k, v in attached.layers]
            )
            self._summed[group] = [None] * len(attached.tensors())
        return self._attached[group] if j == self._last[group] else self._leaves[group]

    def no_grad_for(self, j: int, model, chunk: Batch) -> PromptPass | None:
        """``model``'s prompt pass for the ``j``-th chunk, without gradients (the reference
        model's; one pass a group, released at its last chunk); None where there is no model or
        the chunk runs its own."""
        group = chunk.group_index
        if model is None or not self.shared(group):
            return None
        if group not in self._frozen:
            with torch.no_grad():
                self._frozen[group] = forward.prompt_pass(model, chunk.prompt_ids, self.read)
        return self._frozen.pop(group) if j == self._last[group] else self._frozen[group]

    def collect(self, j: int, group: int) -> None:
        """After the ``j``-th chunk's backward: its gradient at the leaves, summed in float32."""
        if not self.shared(group) or j == self._last[group]:
            return
        summed = self._summed[group]
        for i, leaf in enumerate(self._leaves[group].tensors()):
            if leaf.grad is not None:
                grad = leaf.grad.float()
                summed[i] = grad if summed[i] is None else summed[i] + grad
                leaf.grad = None

    def surrogate(self, j: int, group: int) -> torch.Tensor | float:
        """What the ``j``-th chunk's loss gains: at the group's last chunk, Σ ⟨output, summed
        gradient⟩ over the prompt's outputs (the earlier chunks' gradient through the prompt);
        0.0 elsewhere. The group's pass is released then."""
        if not self.shared(group) or j != self._last[group]:
            return 0.0
        attached = self._attached.pop(group).tensors()
        summed = self._summed.pop(group)
        self._leaves.pop(group)
        terms = [(out.float() * g).sum() for out, g in zip(attached, summed) if g is not None]
        return torch.stack(terms).sum() if terms else 0.0


def prompt_positions(groups: list[int], prompt_lengths: list[int], enabled: bool) -> int:
    """Prompt positions the model runs for chunks of ``groups`` (each chunk's group index) whose
    prompts have ``prompt_lengths`` tokens: once per group where shared, else once per chunk."""
    if not enabled:
        return sum(prompt_lengths)
    return sum(dict(zip(groups, prompt_lengths)).values())


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_(True)
