"""Episodes in the learner: only the policy's tokens are trained on (the environment's tokens
are context, not actions), for every estimator; the KL and entropy ignore them too; GAE runs
over the policy's tokens alone; and single-turn paths train exactly as before.

Mutations tried, each failing a test here: the loss mask built from the token count alone (the
environment's tokens then get a gradient), GAE run over the raw row (the environment's tokens
break the chain of returns), and the per-turn statistics counting the environment's tokens."""

from __future__ import annotations

import pytest
import torch

from brorl.config.train import TrainConfig
from brorl.v1 import common_pb2
from services.learner.algo import gae
from services.learner.algo.advantages import AdvantageInputs, ChunkTokens, compute
from services.learner.algo.surrogate import surrogate_loss
from services.learner.model.batch import advantages_of, build_batches, group_rewards

ENV = 0


def episode_group(rewards=(1.0, 0.0, 0.5)) -> common_pb2.PathGroup:
    """Three episodes: turns of 3, 1 and 2 policy tokens around observations of 2 and 1."""
    g = common_pb2.PathGroup(group_id="g0", prompt_token_ids=[5, 6])
    layouts = [
        [1, 1, 1, ENV, ENV, 2],
        [1, ENV, 2, 2],
        [1, 1, ENV, ENV, ENV, 2, 2, ENV, 3],
    ]
    for i, (turns, r) in enumerate(zip(layouts, rewards)):
        g.paths.add(
            path_id=f"g0/{i}",
            token_ids=[7 + (j % 5) for j in range(len(turns))],
            logprobs=[-0.3 if t else 0.0 for t in turns],
            token_turns=turns,
            turns=max(turns),
            reward=r,
            sampling=common_pb2.SamplingParams(n=3, temperature=1.0, max_tokens=4),
        )
    return g


def test_the_loss_mask_is_the_policys_tokens():
    g = episode_group()
    [chunk] = build_batches([g], advantages_of([g], True), pad_id=0, max_paths=8)
    for row, i in enumerate(chunk.path_index.tolist()):  # rows are sorted by length
        turns = list(g.paths[i].token_turns)
        want = [1.0 if t else 0.0 for t in turns] + [0.0] * (chunk.targets.shape[1] - len(turns))
        assert chunk.loss_mask[row].tolist() == want
        assert chunk.turns[row, : len(turns)].tolist() == turns
    assert chunk.tokens == 4 + 3 + 5  # policy tokens only


def test_the_environments_tokens_get_no_gradient_and_no_kl_or_entropy():
    g = episode_group()
    [chunk] = build_batches([g], advantages_of([g], True), pad_id=0, max_paths=8)
    env = (chunk.turns == ENV) & (chunk.targets != 0)  # the environment's real tokens
    gen = torch.Generator().manual_seed(0)
    logp = (torch.randn(chunk.targets.shape, generator=gen) * 0.3 - 1).requires_grad_(True)
    entropy = torch.rand(chunk.targets.shape, generator=gen)
    ref = logp.detach() + 0.1 * torch.randn(chunk.targets.shape, generator=gen)
    for train in (TrainConfig(kl_coef=0.2), TrainConfig(kl_coef=0.2, kl_in="reward")):
        loss, stats = surrogate_loss(logp, entropy, chunk, train, ref)
        (grad,) = torch.autograd.grad(loss, logp)
        assert float(grad[env].abs().max()) == 0.0
        assert float(grad[chunk.loss_mask != 0].abs().max()) > 0
        huge = torch.where(env, 1e6, entropy)
        _, again = surrogate_loss(logp, huge, chunk, train, torch.where(env, -1e6, ref))
        assert again["entropy"] == pytest.approx(stats["entropy"])
        assert again.get("kl", 0.0) == pytest.approx(stats.get("kl", 0.0))
    per_turn = {k for k in stats if k.startswith("logp_gap/turn")}
    assert per_turn == {f"logp_gap/turn{k}" for k in (1, 2, 3)}
    gap = (logp.detach() - chunk.sampling_logp).abs()
    for k in (1, 2, 3):
        assert stats[f"logp_gap/turn{k}"] == pytest.approx(float(gap[chunk.turns == k].mean()))


def test_gae_runs_over_the_policys_tokens_alone():
    g = episode_group()
    zeros = [torch.zeros(len(g.paths))]
    [chunk] = build_batches([g], zeros, pad_id=0, max_paths=8)
    values = torch.rand(chunk.targets.shape, generator=torch.Generator().manual_seed(1))
    tokens = [ChunkTokens(0, chunk.path_index, chunk.loss_mask, chunk.weight, values=values)]
    inputs = AdvantageInputs("ppo", [group_rewards(g)], gamma=0.9, lam=0.8, whiten=False,
                             chunks=tokens)  # fmt: skip
    out = compute(inputs)
    for row, index in enumerate(chunk.path_index.tolist()):  # rows are sorted by length
        path = g.paths[index]
        policy = [i for i, t in enumerate(path.token_turns) if t]
        want, want_ret = gae.gae_reference(
            [0.0] * (len(policy) - 1) + [path.reward], [float(values[row, i]) for i in policy],
            0.9, 0.8,
        )  # fmt: skip
        got = [float(out.per_token[0][row, i]) for i in policy]
        assert got == pytest.approx(want, abs=1e-5), row
        assert [float(out.returns[0][row, i]) for i in policy] == pytest.approx(want_ret, abs=1e-5)
        env = [i for i, t in enumerate(path.token_turns) if not t]
        assert all(float(out.per_token[0][row, i]) == 0.0 for i in env)


def test_single_turn_paths_train_exactly_as_before():
    """A group of one-turn paths, and the same paths marked as one-turn episodes (every token
    the policy's): the same chunks, the same loss and gradient, bit for bit."""
    plain = common_pb2.PathGroup(group_id="g1", prompt_token_ids=[5])
    sampling = common_pb2.SamplingParams(n=3, temperature=1.0, max_tokens=4)
    for i, n in enumerate((3, 1, 4)):
        plain.paths.add(
            path_id=f"g1/{i}", token_ids=[7] * n, logprobs=[-0.4] * n, reward=i, sampling=sampling
        )
    marked = common_pb2.PathGroup()
    marked.CopyFrom(plain)
    for p in marked.paths:
        p.token_turns.extend([1] * len(p.token_ids))
    a, b = (build_batches([x], advantages_of([x], True), 0, 8)[0] for x in (plain, marked))
    assert torch.equal(a.loss_mask, b.loss_mask) and torch.equal(a.advantages, b.advantages)
    logp = torch.full(a.targets.shape, -0.5, requires_grad=True)
    la, _ = surrogate_loss(logp, torch.zeros_like(logp), a, TrainConfig())
    lb, _ = surrogate_loss(logp, torch.zeros_like(logp), b, TrainConfig())
    (ga,), (gb,) = torch.autograd.grad(la, logp), torch.autograd.grad(lb, logp)
    assert torch.equal(la, lb) and torch.equal(ga, gb)


# The loss and |gradient| sum of a fixed single-turn batch, as the learner computed them before
# episodes existed (commit 37d66e1, the parent of the multi-turn change; float.hex). Compared to
# 1e-6 relative, not bit for bit: torch's vectorised exp/log round the last bits differently on
# another CPU (seen: gspo_clip_higher's gradient sum 1 ulp of float32 apart on a newer VM), while a
# change in what the loss reads fails all three (tried: one padding token put into the loss mask).
BEFORE_EPISODES = {
    "default": ("0x1.01ea880000000p-5", "0x1.23de4ee000000p-2"),
    "kl": ("0x1.0318580000000p-5", "0x1.2759a406f0000p-2"),
    "gspo_clip_higher": ("0x1.cefbe40000000p-6", "0x1.c620408000000p-3"),
}


@pytest.mark.parametrize("name", sorted(BEFORE_EPISODES))
def test_a_fixed_single_turn_batch_gives_the_losses_it_gave_before_episodes(name):
    train = {
        "default": TrainConfig(),
        "kl": TrainConfig(kl_coef=0.1),
        "gspo_clip_higher": TrainConfig(
            ratio_level="sequence", clip_high=0.28, estimator="dr_grpo"
        ),
    }[name]
    g = common_pb2.PathGroup(group_id="g1", prompt_token_ids=[5, 9])
    sampling = common_pb2.SamplingParams(n=5, temperature=1.0, max_tokens=6)
    for i, n in enumerate((3, 1, 6, 4, 2)):
        g.paths.add(path_id=f"g1/{i}", token_ids=[(7 + 3 * i + j) % 17 + 4 for j in range(n)],
                    logprobs=[-0.1 - 0.07 * ((i + j) % 5) for j in range(n)],
                    reward=[1.0, 0.0, 0.5, 0.0, 1.0][i], sampling=sampling)  # fmt: skip
    [chunk] = build_batches([g], advantages_of([g], True), 0, 8)
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(chunk.targets.shape, generator=gen) * 0.2 - 0.5
    entropy = torch.rand(chunk.targets.shape, generator=gen)
    ref = logp + 0.05 * torch.randn(chunk.targets.shape, generator=gen)
    x = logp.clone().requires_grad_(True)
    loss, _ = surrogate_loss(x, entropy, chunk, train, ref)
    (grad,) = torch.autograd.grad(loss, x)
    got = (float(loss.detach()), float(grad.double().abs().sum()))
    want = tuple(float.fromhex(h) for h in BEFORE_EPISODES[name])
    assert got == pytest.approx(want, rel=1e-6, abs=0)
