"""The model's forward pass over one chunk of a group (batch.Batch): the shared prompt runs
once, and every completion continues from its key/value cache, instead of the prompt being
recomputed for each of the group's paths (with N = 512 paths of a few tokens after a prompt
of similar length, that is most of the work; docs/performance.md).

Under the learner's CPU attention (prefix_attention.py) every path's queries read the one
prompt's keys and values; under another (SDPA on CUDA) the prompt's cache is expanded to the
chunk's b paths as a view. Either way autograd sums the paths' gradients back into the one prompt
computation, so the gradients equal those of running every path's full sequence
(``completion_logits_reference``, the test oracle). The policy's update runs a group's prompt
once for all of the group's chunks (``PromptPass``, prompt_once.py).

Shapes: b paths, P prompt tokens, C completion positions, V vocabulary, k key/value heads, d head
dimension.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.learner.model import prefix_attention
from services.learner.model.batch import Batch


@dataclass
class PromptPass:
    """A group's prompt run through the model once: what a chunk's continuation reads of it."""

    first: torch.Tensor  # (1, 1, D) the read output at the prompt's last position: predicts token 0
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (1, k, P, d) keys and values

    def tensors(self) -> list[torch.Tensor]:
        return [self.first, *(t for kv in self.layers for t in kv)]


def logits_of(output) -> torch.Tensor:
    """The policy's read of a model output: (rows, positions, V) logits."""
    return output.logits


def hidden_of(output) -> torch.Tensor:
    """The critic's read of its trunk's output: (rows, positions, H) last hidden states."""
    return output.last_hidden_state


def prompt_pass(model, prompt_ids: torch.Tensor, read, cache: bool = True) -> PromptPass:
    """``prompt_ids`` (P,) through ``model`` as one row; its keys and values only with ``cache``
    (a chunk of one-token completions reads none)."""
    if prompt_ids.shape[0] == 0:
        raise ValueError("a group without prompt tokens has no position to predict its first token")
    out = model(input_ids=prompt_ids[None, :], use_cache=cache)  # (1, P)
    layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers] if cache else []
    return PromptPass(read(out)[:, -1:, :], layers)


def completion_logits(model, batch: Batch, prompt: PromptPass | None = None) -> torch.Tensor:
    """(b, C, V) float32 logits that predict each completion token of the chunk; ``prompt``: the
    chunk's group's prompt already run (prompt_once.py), else the chunk runs it."""
    return completion_outputs(model, batch, logits_of, prompt).float()


def completion_states(trunk, batch: Batch, prompt: PromptPass | None = None) -> torch.Tensor:
    """(b, C, H) last hidden states of a model trunk (no LM head; the critic's) at the same
    positions: the state from which completion token t is predicted."""
    return completion_outputs(trunk, batch, hidden_of, prompt)


def completion_outputs(model, batch: Batch, read, prompt: PromptPass | None = None) -> torch.Tensor:
    """(b, C, D): ``read(output)`` (a (rows, positions, D) tensor of the model's output) at the
    position that predicts each completion token; the prompt runs once per chunk unless
    ``prompt`` holds its pass (made by the same ``read``)."""
    b, C = batch.targets.shape
    if prompt is None:
        prompt = prompt_pass(model, batch.prompt_ids, read, cache=C > 1)
    first = prompt.first.expand(b, 1, -1)  # (b, 1, D): predicts completion token 0
    if C == 1:
        return first
    P = batch.prompt_ids.shape[0]
    positions = torch.arange(P, P + C - 1, device=first.device)[None, :].expand(b, -1)  # (b, C-1)
    # Right padding needs no attention mask: a real token never attends to a later pad.
    continuation = dict(input_ids=batch.targets[:, :-1], position_ids=positions, use_cache=False)
    if prefix_attention.serves_shared_prompt(model):
        # the prompt's keys and values read once by every path (prefix_attention.py)
        with prefix_attention.shared_prompt(prompt.layers):
            rest = read(model(**continuation))  # (b, C-1, D)
    else:
        rest = read(model(**continuation, past_key_values=_expanded(prompt.layers, b)))
    return torch.cat([first, rest], dim=1)


def completion_logits_reference(model, batch: Batch) -> torch.Tensor:
    """The same logits from every path's full sequence (prompt + completion): the twin the
    prefix-shared path is tested against, P + C - 1 positions per path."""
    b, C = batch.targets.shape
    P = batch.prompt_ids.shape[0]
    input_ids = torch.cat([batch.prompt_ids[None, :].expand(b, -1), batch.targets], dim=1)
    logits = model(input_ids=input_ids).logits  # (b, P + C, V)
    return logits[:, P - 1 : P - 1 + C].float()


def _expanded(layers, b: int):
    """A key/value cache whose tensors are (b, ...) views of the one-row ``layers``."""
    from transformers import DynamicCache

    out = DynamicCache()
    for i, (keys, values) in enumerate(layers):
        out.update(keys.expand(b, -1, -1, -1), values.expand(b, -1, -1, -1), i)
    return out
