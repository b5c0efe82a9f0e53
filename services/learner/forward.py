"""The model's forward pass over one chunk of a group (batch.Batch): the shared prompt runs
once, and every completion continues from its key/value cache, instead of the prompt being
recomputed for each of the group's paths (with N = 512 paths of a few tokens after a prompt
of similar length, that is most of the work; docs/performance.md).

The prompt's cache is expanded to the chunk's b paths as a view: autograd sums the paths'
gradients back into the one prompt computation, so the gradients equal those of running
every path's full sequence (``completion_logits_reference``, the test oracle).

Shapes: b paths, P prompt tokens, C completion positions, V vocabulary.
"""

from __future__ import annotations

import torch

from services.learner.batch import Batch


def completion_logits(model, batch: Batch) -> torch.Tensor:
    """(b, C, V) float32 logits that predict each completion token of the chunk."""
    b, C = batch.targets.shape
    prompt = batch.prompt_ids[None, :]  # (1, P)
    if prompt.shape[1] == 0:
        raise ValueError("a group without prompt tokens has no position to predict its first token")
    out = model(input_ids=prompt, use_cache=C > 1)
    first = out.logits[:, -1:, :].expand(b, 1, -1)  # (b, 1, V): predicts completion token 0
    if C == 1:
        return first.float()
    cache = _expanded(out.past_key_values, b)
    P = prompt.shape[1]
    positions = torch.arange(P, P + C - 1, device=prompt.device)[None, :].expand(b, -1)  # (b, C-1)
    # Right padding needs no attention mask: a real token never attends to a later pad.
    rest = model(
        input_ids=batch.targets[:, :-1],
        position_ids=positions,
        past_key_values=cache,
        use_cache=False,
    ).logits  # (b, C-1, V)
    return torch.cat([first, rest], dim=1).float()


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
