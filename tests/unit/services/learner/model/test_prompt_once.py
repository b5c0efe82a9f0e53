"""A group's prompt run once per optimizer step for all of its chunks (prompt_once.py): the same
losses and gradients as a prompt pass per chunk, in any order of the chunks, for groups of one
chunk, one-token completions, every attention the learner runs, PPO's critic (its values and its
value loss's gradients) and a whole Policy update, with and without a critic."""

from __future__ import annotations

import random

import pytest
import torch

from brorl.config.train import TrainConfig
from brorl.v1 import common_pb2
from services.learner.model import forward
from services.learner.model.batch import advantages_of, build_batches
from services.learner.model.critic import ValueModel
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
        ref_prompt = prompts.no_grad_for(j, ref, chunk)
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
    # Adam's first step is about lr x sign(gradient) per weight, so a gradient summed in another
    # order moves a weight whose gradient nearly cancels by up to ~1e-6 (seen on an Ice Lake VM):
    # 1e-5 is a thousandth of a step of lr 1e-2; a missing share of the prompt's gradient moves
    # weights by up to a whole step
    assert torch.allclose(moved[0], moved[1], rtol=1e-5, atol=1e-5)
    chunks = build_batches(groups, advantages_of(groups, True), pad_id=0, max_paths=2)
    extra = sum(len(g.prompt_token_ids) * (sum(c.group_index == i for c in chunks) - 1)
                for i, g in enumerate(groups))  # fmt: skip
    assert extra > 0 and positions[1] - positions[0] == extra


def critic_gradients(
    critic, chunks, order, shared: bool
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The critic's values of each chunk without gradients (as the token-level estimators read
    them first), then the gradient of Σ ⟨values, a fixed weight⟩ chunk by chunk in ``order``."""
    read = forward.hidden_of
    frozen = GroupPrompts([chunks[i].group_index for i in order], shared, read)
    with torch.no_grad():
        first = [
            critic(chunks[i], frozen.no_grad_for(j, critic.trunk, chunks[i]))
            for j, i in enumerate(order)
        ]
    critic.zero_grad(set_to_none=True)
    prompts = GroupPrompts([chunks[i].group_index for i in order], shared, read)
    for j, i in enumerate(order):
        chunk = chunks[i]
        values = critic(chunk, prompts.prompt_for(j, critic.trunk, chunk))  # (b, C)
        weight = torch.linspace(-1.0, 2.0, values.numel()).reshape(values.shape)
        ((values * weight).sum() + prompts.surrogate(j, chunk.group_index)).backward()
        prompts.collect(j, chunk.group_index)
    flat = torch.cat([p.grad.flatten() for p in critic.parameters() if p.grad is not None])
    return first, flat


@pytest.mark.parametrize("shuffled", [False, True])
def test_the_critic_shares_a_groups_prompt_with_the_same_values_and_gradients(shuffled):
    trunk = tiny_qwen2(attention=ATTENTION).model
    critic = ValueModel(trunk, trunk.config.hidden_size)
    torch.nn.init.normal_(critic.head.weight, std=0.5)  # a zero head would pass no gradient back
    groups = irregular_groups() + [one_token_group()]
    chunks = build_batches(groups, advantages_of(groups, True), pad_id=0, max_paths=2)
    order = list(range(len(chunks)))
    if shuffled:
        random.Random(3).shuffle(order)
    want_values, want = critic_gradients(critic, chunks, order, shared=False)
    got_values, got = critic_gradients(critic, chunks, order, shared=True)
    for a, b in zip(got_values, want_values):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-6), float((got - want).abs().max())


@pytest.mark.slow
def test_a_ppo_update_with_shared_prompts_moves_policy_and_critic_as_without(tmp_path):
    """PPO with the KL in the reward reads all three models before the update (critic values,
    the policy's and the reference's log-probs) and trains policy and critic over 2 epochs x 2
    mini-batches: with the prompt shared, every weight moves as with a prompt per chunk, and the
    critic's trunk runs fewer forwards."""
    from services.learner.model.policy import Policy

    tiny_qwen2().save_pretrained(tmp_path)
    groups = irregular_groups(seed=2)
    moved, calls = [], []
    for once in (True, False):
        train = TrainConfig(
            lr=1e-2,
            micro_batch_paths=2,
            prompt_once=once,
            estimator="ppo",
            kl_coef=0.1,
            kl_in="reward",
            ppo={"epochs": 2, "minibatches": 2, "value_lr": 1e-2},
        )
        policy = Policy(str(tmp_path), train)
        torch.nn.init.normal_(policy.critic.engine.module.head.weight, std=0.5)
        count = []
        policy.critic.trunk.register_forward_hook(lambda *_: count.append(1))
        policy.update(groups)
        calls.append(len(count))
        models = (policy.model, policy.critic.engine.module)
        moved.append([torch.cat([p.detach().flatten() for p in m.parameters()]) for m in models])
    for got, want in zip(*moved):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), float((got - want).abs().max())
    assert calls[0] < calls[1], calls
