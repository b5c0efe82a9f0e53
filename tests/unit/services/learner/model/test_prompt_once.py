"""A group's prompt run once per optimizer step for all of its chunks (prompt_once.py): the same
losses and gradients as a prompt pass per chunk, in any order of the chunks, for groups of one
chunk, one-token completions, every attention the learner runs and a whole Policy update."""

from __future__ import annotations

import random

import pytest
import torch

from brorl.config.train import TrainConfig
from brorl.v1 import common_pb2
from services.learner.model.batch import advantages_of, build_batches
from services.learner.model.losses import policy_loss
from services.learner.model.prefix_attention import ATTENTION
from services.learner.model.prompt_once import GroupPrompts, prompt_positions
from tests.unit.services.learner.model.test_forward import irregular_groups
from tests.unit.services.learner.tiny_model import tiny_qwen2


def one_token_group() -> common_pb2.PathGroup:
    """A group whose completions are one token each: a chunk of it reads no keys or values."""
    g = common_pb2.PathGroup(group_id="short", prompt_token_ids=[2, 9, 4])
    for i in range(5):
        g.paths.add(
            path_id=f"short/{i}",
            token_ids=[3 + i],
            logprobs=[-1.5],
            reward=float(i % 2),
            sampling=common_pb2.SamplingParams(temperature=1.0),
        )
    return g


def gradients(
    model, chunks, order, shared: bool, ref=None, train=None
) -> tuple[list[float], torch.Tensor]:
    """The chunks' losses and the gradient of Σ loss × tokens, chunk by chunk in ``order``, as
    Policy's loop runs them (one backward per chunk); ``ref``: a reference model (train's KL)."""
    model.zero_grad(set_to_none=True)
    prompts = GroupPrompts([chunks[i].group_index for i in order], enabled=shared)
    losses = []
    for j, i in enumerate(order):
        chunk = chunks[i]
        prompt = prompts.prompt_for(j, model, chunk)
        ref_prompt = prompts.reference_for(j, ref, chunk)
        loss, _ = policy_loss(model, chunk, train or TrainConfig(), ref, prompt, ref_prompt)
        (loss * chunk.tokens + prompts.surrogate(j, chunk.group_index)).backward()
        prompts.collect(j, chunk.group_index)
        losses.append(float(loss.detach()))
    flat = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return losses, flat


@pytest.mark.parametrize("attention", ["eager", "sdpa", ATTENTION])
@pytest.mark.parametrize("max_paths", [1, 2, 3])
@pytest.mark.parametrize("shuffled", [False, True])
def test_a_shared_prompt_gives_the_gradients_of_a_prompt_per_chunk(attention, max_paths, shuffled):
    model = tiny_qwen2(attention=attention)
    groups = irregular_groups() + [one_token_group()]
    chunks = build_batches(groups, advantages_of(groups, True), pad_id=0, max_paths=max_paths)
    order = list(range(len(chunks)))
    if shuffled:  # PPO's mini-batches take chunks in any order, groups interleaved
        random.Random(max_paths).shuffle(order)
    assert max(sum(c.group_index == g for c in chunks) for g in range(len(groups))) > 1
    want_losses, want = gradients(model, chunks, order, shared=False)
    got_losses, got = gradients(model, chunks, order, shared=True)
    assert got_losses == pytest.approx(want_losses, rel=1e-5, abs=1e-6)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-6), float((got - want).abs().max())


def test_the_reference_model_runs_a_groups_prompt_once_with_the_same_kl():
    model, ref = tiny_qwen2(attention=ATTENTION), tiny_qwen2(attention=ATTENTION, seed=1)
    ref.requires_grad_(False)
    calls = []
    ref.register_forward_hook(lambda _m, args, kwargs, _out: calls.append(kwargs), with_kwargs=True)
    groups = irregular_groups()
    chunks = build_batches(groups, advantages_of(groups, True), pad_id=0, max_paths=2)
    order, train = list(range(len(chunks))), TrainConfig(kl_coef=0.5)
    want_losses, want = gradients(model, chunks, order, False, ref, train)
    per_chunk = len(calls)
    calls.clear()
    got_losses, got = gradients(model, chunks, order, True, ref, train)
    assert got_losses == pytest.approx(want_losses, rel=1e-5, abs=1e-6)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-6)
    prompts_saved = sum(sum(c.group_index == g for c in chunks) - 1 for g in range(len(groups)))
    assert prompts_saved > 0 and per_chunk - len(calls) == prompts_saved


def test_a_sliding_window_model_shares_its_prompt_through_the_expanded_cache():
    model = tiny_qwen2(attention=ATTENTION, sliding_window=3)
    groups = irregular_groups(seed=1)
    chunks = build_batches(groups, advantages_of(groups, True), pad_id=0, max_paths=2)
    order = list(range(len(chunks)))
    want = gradients(model, chunks, order, shared=False)[1]
    got = gradients(model, chunks, order, shared=True)[1]
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-6)


def test_only_groups_of_several_chunks_share_and_a_pass_is_released_at_its_last_chunk():
    model = tiny_qwen2(attention=ATTENTION)
    groups = irregular_groups()  # 5, 7, 2 and 1 paths
    chunks = build_batches(groups, advantages_of(groups, True), pad_id=0, max_paths=3)
    prompts = GroupPrompts([c.group_index for c in chunks])
    assert [prompts.shared(g) for g in range(4)] == [True, True, False, False]
    first, second = chunks[0], chunks[1]  # group 0's two chunks
    leaves = prompts.prompt_for(0, model, first)
    assert all(t.is_leaf and t.requires_grad for t in leaves.tensors())
    attached = prompts.prompt_for(1, model, second)
    assert not any(t.is_leaf for t in attached.tensors())
    assert prompts.surrogate(0, 0) == 0.0  # not the group's last chunk
    assert prompts.surrogate(1, 0) == 0.0  # no gradient was collected: nothing to carry
    assert prompts._attached == {}  # released
    assert prompts.prompt_for(j=len(chunks) - 1, model=model, chunk=chunks[-1]) is None


def test_prompt_positions_count_a_shared_prompt_once_per_group():
    assert prompt_positions([0, 0, 1, 0], [7, 7, 3, 7], enabled=True) == 10
    assert prompt_positions([0, 0, 1, 0], [7, 7, 3, 7], enabled=False) == 24


@pytest.mark.slow
def test_a_policy_update_with_a_shared_prompt_moves_the_weights_as_without(tmp_path):
    from services.learner.model.policy import Policy

    tiny_qwen2().save_pretrained(tmp_path)
    groups = irregular_groups(seed=2)
    moved, positions = [], []
    for once in (True, False):
        policy = Policy(str(tmp_path), TrainConfig(lr=1e-2, micro_batch_paths=2, prompt_once=once))
        stats = policy.update(groups)
        moved.append(torch.cat([p.detach().flatten() for p in policy.model.parameters()]))
        positions.append(stats["learner/positions"])
    assert torch.allclose(moved[0], moved[1], rtol=1e-5, atol=1e-6)
    chunks = build_batches(groups, advantages_of(groups, True), pad_id=0, max_paths=2)
    extra = sum(len(g.prompt_token_ids) * (sum(c.group_index == i for c in chunks) - 1)
                for i, g in enumerate(groups))  # fmt: skip
    assert extra > 0 and positions[1] - positions[0] == extra
