"""The prefix-shared forward (prompt once, completions on its cache) against its twin that
runs every path's full sequence: same logits, same gradients, on irregular groups."""

from __future__ import annotations

import random

import pytest
import torch

from brorl.v1 import common_pb2
from services.learner.model.batch import advantages_of, build_batches
from services.learner.model.forward import completion_logits, completion_logits_reference
from services.learner.model.prefix_attention import ATTENTION
from tests.unit.services.learner.tiny_model import tiny_qwen2


def irregular_groups(seed: int = 0) -> list[common_pb2.PathGroup]:
    rng = random.Random(seed)
    groups = []
    for gi, (prompt_len, paths) in enumerate([(1, 5), (3, 7), (7, 2), (4, 1)]):
        g = common_pb2.PathGroup(
            group_id=f"g{gi}", prompt_token_ids=[rng.randrange(1, 21) for _ in range(prompt_len)]
        )
        for i in range(paths):
            toks = [rng.randrange(1, 21) for _ in range(rng.randint(1, 6))]
            g.paths.add(
                path_id=f"g{gi}/{i}",
                token_ids=toks,
                logprobs=[-1.0] * len(toks),
                reward=float(i % 2),
                sampling=common_pb2.SamplingParams(temperature=1.0),
            )
        groups.append(g)
    return groups


@pytest.mark.parametrize("attention", ["eager", "sdpa", ATTENTION])
@pytest.mark.parametrize("max_paths", [1, 3, 64])
def test_prefix_shared_logits_equal_full_sequence_logits(attention, max_paths):
    model = tiny_qwen2(attention=attention).eval()
    groups = irregular_groups()
    for batch in build_batches(groups, advantages_of(groups, True), pad_id=0, max_paths=max_paths):
        with torch.no_grad():
            got = completion_logits(model, batch)  # (b, C, V)
            want = completion_logits_reference(model, batch)
        mask = batch.loss_mask.bool()
        assert got.shape == want.shape
        assert torch.allclose(got[mask], want[mask], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", ["eager", ATTENTION])
def test_prefix_shared_gradients_equal_full_sequence_gradients(attention):
    groups = irregular_groups(seed=1)
    grads = []
    for forward in (completion_logits, completion_logits_reference):
        model = tiny_qwen2(seed=3, attention=attention)
        for batch in build_batches(groups, advantages_of(groups, True), pad_id=0, max_paths=3):
            logp = torch.log_softmax(forward(model, batch), -1)
            picked = logp.gather(-1, batch.targets[..., None]).squeeze(-1)  # (b, C)
            (picked * batch.loss_mask * batch.advantages[:, None]).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, want in grads[1].items():
        assert torch.allclose(grads[0][name], want, atol=1e-6, rtol=1e-4), name


def test_under_a_sliding_window_the_cache_is_expanded_and_the_logits_still_agree():
    model = tiny_qwen2(attention=ATTENTION, sliding_window=3).eval()
    assert "sliding_attention" in model.config.layer_types
    groups = irregular_groups(seed=2)
    for batch in build_batches(groups, advantages_of(groups, True), pad_id=0, max_paths=4):
        with torch.no_grad():
            got, want = completion_logits(model, batch), completion_logits_reference(model, batch)
        mask = batch.loss_mask.bool()
        assert torch.allclose(got[mask], want[mask], atol=1e-5, rtol=1e-5)


def test_a_prefix_shared_chunk_runs_fewer_positions():
    groups = irregular_groups()
    batches = build_batches(groups, advantages_of(groups, True), pad_id=0, max_paths=64)
    shared = sum(b.positions for b in batches)
    full = sum(len(b) * (b.prompt_ids.shape[0] + b.targets.shape[1]) for b in batches)
    assert shared < full


def test_a_group_without_prompt_tokens_is_refused():
    g = common_pb2.PathGroup(group_id="g")
    g.paths.add(token_ids=[1, 2], logprobs=[-1.0, -1.0], reward=1.0)
    g.paths.add(token_ids=[3], logprobs=[-1.0], reward=0.0)
    [batch] = build_batches([g], advantages_of([g], True), pad_id=0, max_paths=8)
    with pytest.raises(ValueError, match="without prompt tokens"):
        completion_logits(tiny_qwen2(), batch)
