"""The model's forward pass over one chunk of a group (batch.Batch): the shared prompt runs
once, and every completion continues from its key/value cache, instead of the prompt being
recomputed for each of the group's paths (with N = 512 paths of a few tokens after a prompt
of similar length, that is most of the work; docs/performance.md).

Under the learner's CPU attention (prefix_attention.py) every path's queries read the one
prompt's keys and values; under another (SDPA on CUDA) the prompt's cache is expanded to the
chunk's b paths as a view. Either way autograd sums the paths' gradients back into the one prompt
computation, so the gradients equal those of running every path's full sequence
(``completion_logits_reference``, the test oracle).

Shapes: b paths, P prompt tokens, C completion positions, V vocabulary.
"""

from __future__ import annotations

import torch

from services.learner.model import prefix_attention
from services.learner.model.batch import Batch


def completion_logits(model, batch: Batch) -> torch.Tensor:
    """(b, C, V) float32 logits that predict each completion token of the chunk."""
    return completion_outputs(model, batch, lambda out: out.logits).float()


def completion_states(trunk, batch: Batch) -> torch.Tensor:
    """(b, C, H) last hidden states of a model trunk (no LM head; the critic's) at the same
    positions: the state from which completion token t is predicted."""
    return completion_outputs(trunk, batch, lambda out: out.last_hidden_state)


def completion_outputs(model, batch: Batch, read) -> torch.Tensor:
    """(b, C, D): ``read(output)`` (a (rows, positions, D) tensor of the model's output) at the
    position that predicts each completion token; the prompt runs once per chunk."""
    b, C = batch.targets.shape
    prompt = batch.prompt_ids[None, :]  # (1, P)
    if prompt.shape[1] == 0:
        raise ValueError("a group without prompt tokens has no position to predict its first token")
    out = model(input_ids=prompt, use_cache=C > 1)
    first = read(out)[:, -1:, :].expand(b, 1, -1)  # (b, 1, D): predicts completion token 0
    if C == 1:
        return first
    P = prompt.shape[1]
    positions = torch.arange(P, P + C - 1, device=prompt.device)[None, :].expand(b, -1)  # (b, C-1)
    # Right padding needs no attention mask: a real token never attends to a later pad.
    continuation = dict(input_ids=batch.targets[:, :-1], position_ids=positions, use_cache=False)
    if prefix_attention.serves_shared_prompt(model):
        # the prompt's keys and values read once by every path (prefix_attention.py)
        layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        with prefix_attention.shared_prompt(layers):
            rest = read(model(**continuation))  # (b, C-1, D)
    else:
        rest = read(model(**continuation, past_key_values=_expanded(out.past_key_values, b)))
    return torch.cat([first, rest], dim=1)


def completion_logits_reference(model, batch: Batch) -> torch.Tensor:
    """The same logits from every path's full sequence (prompt + completion): the twin the
    prefix-shared path is tested against, P + C - 1 positions per path."""
    b, C = batch.targets.shape
    P = batch.prompt_ids.shape[0]
    input_ids = torch.cat([batch.prompt_ids[None, :].expand(b, -1), batch.targets], dim=1)
    logits = model(input_ids=input_ids).logits  # (b, P + C, V)
    return logits[:, P - 1 : P - 1 + C].float()


def _expanded(cache, b: int):
    """A copy of a one-row key/value cache whose tensors are (b, ...) views of the row."""
    from transformers import DynamicCache

    out = DynamicCache()
    for i, layer in enumerate(cache.layers):
        out.update(layer.keys.expand(b, -1, -1, -1), layer.values.expand(b, -1, -1, -1), i)
    return out
