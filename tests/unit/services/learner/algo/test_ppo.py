"""PPO's critic math (services/learner/algo/ppo.py) against float64 twins and hand-worked numbers,
and the real Policy with estimator ppo (critic, GAE, epochs, mini-batches) on a tiny Qwen2.

Mutations tried, each failing these tests: GAE's ``gamma * lam * running`` as
``gamma * running``; the value after a path's end not 0 (``next_v`` read past the mask);
whitening per chunk instead of over the step; the value loss's ``maximum`` as ``minimum``."""

from __future__ import annotations

import pytest
import torch

from brorl.config.train import TrainConfig
from services.learner.algo import gae, ppo
from tests.unit.services.learner.algo.test_adaptive_kl import sample_groups
from tests.unit.services.learner.tiny_model import tiny_qwen2


def padded(rows: list[list[float]], T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) float64 values right-padded with junk, and their (B, T) mask."""
    x = torch.full((len(rows), T), 99.0, dtype=torch.float64)
    m = torch.zeros((len(rows), T), dtype=torch.float64)
    for i, r in enumerate(rows):
        x[i, : len(r)] = torch.tensor(r, dtype=torch.float64)
        m[i, : len(r)] = 1
    return x, m


def test_gae_hand_worked():
    # one path of 3 tokens, reward 1 at the end, values 0.5, 0.25, 0.0; gamma 1, lam 0.5:
    # deltas: 0.25-0.5=-0.25, 0-0.25=-0.25, 1-0=1; A2=1, A1=-0.25+0.5*1=0.25, A0=-0.25+0.125
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.25, 0.0]], dtype=torch.float64)
    adv, ret = gae.gae(rewards, values, torch.ones_like(values), 1.0, 0.5)
    assert adv.tolist() == [[-0.125, 0.25, 1.0]]
    assert ret.tolist() == [[0.375, 0.5, 1.0]]
    # lam = 1, gamma = 1: A_t = R - V_t (Monte Carlo return minus the value)
    adv, _ = gae.gae(rewards, values, torch.ones_like(values), 1.0, 1.0)
    assert adv.tolist() == [[0.5, 0.75, 1.0]]


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.0), (0.97, 1.0), (0.5, 0.3)])
def test_gae_matches_reference_on_irregular_paths(gamma, lam):
    gen = torch.Generator().manual_seed(3)
    lengths = [7, 1, 0, 4, 7, 2]  # an empty path and a one-token path among them
    T = 7
    vals = [torch.randn(n, generator=gen, dtype=torch.float64).tolist() for n in lengths]
    final = torch.randn(len(lengths), generator=gen, dtype=torch.float64)  # (B,)
    pen = [(0.1 * torch.randn(n, generator=gen, dtype=torch.float64)).tolist() for n in lengths]
    values, mask = padded(vals, T)
    penalty, _ = padded(pen, T)
    token_r = gae.token_rewards(final, mask, penalty).double()
    adv, ret = gae.gae(token_r, values, mask, gamma, lam)
    for i, n in enumerate(lengths):
        r = [pen[i][t] + (final[i].item() if t == n - 1 else 0.0) for t in range(n)]
        want_a, want_r = gae.gae_reference(r, vals[i], gamma, lam)
        assert adv[i, :n].tolist() == pytest.approx(want_a, abs=1e-12)
        assert ret[i, :n].tolist() == pytest.approx(want_r, abs=1e-12)
        assert adv[i, n:].abs().sum() == 0 and ret[i, n:].abs().sum() == 0


def test_token_rewards_put_the_reward_on_the_last_token():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=torch.float32)
    out = gae.token_rewards(torch.tensor([2.0, 3.0, 5.0]), mask)
    assert out.tolist() == [[0, 0, 2], [3, 0, 0], [0, 0, 0]]


def test_whiten_shares_one_scale_over_chunks_of_different_widths():
    a, ma = padded([[1.0, 2.0, 3.0], [4.0]], 3)
    b, mb = padded([[10.0, -2.0]], 2)
    out = gae.whiten([a, b], [ma, mb])
    want = gae.whiten_reference([1.0, 2.0, 3.0, 4.0, 10.0, -2.0])
    got = out[0][0].tolist() + out[0][1, :1].tolist() + out[1][0].tolist()
    assert got == pytest.approx(want, abs=1e-9)
    assert out[0][1, 1:].abs().sum() == 0  # masked stays 0
    same, m1 = padded([[2.0, 2.0]], 2)
    assert gae.whiten([same], [m1])[0].abs().sum() == 0  # no spread: zeros
    assert gae.whiten([torch.ones(1, 1)], [torch.ones(1, 1)])[0].item() == 0  # one token


def test_value_loss_matches_reference_and_clips():
    gen = torch.Generator().manual_seed(1)
    rows = [5, 2, 3]
    v = [torch.randn(n, generator=gen, dtype=torch.float64).tolist() for n in rows]
    o = [torch.randn(n, generator=gen, dtype=torch.float64).tolist() for n in rows]
    r = [torch.randn(n, generator=gen, dtype=torch.float64).tolist() for n in rows]
    (values, mask), (old, _), (ret, _) = padded(v, 5), padded(o, 5), padded(r, 5)
    loss, stats = ppo.value_loss(values, old, ret, mask, clip=0.2)
    flat = [sum(x, []) for x in (v, o, r)]
    assert float(loss) == pytest.approx(ppo.value_loss_reference(*flat, clip=0.2), abs=1e-12)
    assert 0 < stats["value_clip_frac"] < 1
    # hand-worked: V 2, old 0, R 2: unclipped 0, clipped (0.2-2)^2 -> 0.5 * 3.24
    one = torch.ones(1, 1, dtype=torch.float64)
    loss, _ = ppo.value_loss(2 * one, 0 * one, 2 * one, one, clip=0.2)
    assert float(loss) == pytest.approx(1.62)


def test_passes_visit_every_chunk_once_per_epoch():
    parts = ppo.passes(5, epochs=3, minibatches=2, generator=torch.Generator().manual_seed(0))
    assert len(parts) == 6 and all(parts)
    for e in range(3):
        assert sorted(parts[2 * e] + parts[2 * e + 1]) == [0, 1, 2, 3, 4]
    assert ppo.passes(1, 2, 4, torch.Generator()) == [[0], [0]]  # fewer chunks than parts


def test_explained_variance():
    r = torch.tensor([1.0, 2.0, 3.0])
    assert ppo.explained_variance(r, r, torch.ones(3)) == pytest.approx(1.0)
    assert ppo.explained_variance(torch.full((3,), 2.0), r, torch.ones(3)) == pytest.approx(0.0)


@pytest.mark.slow
def test_ppo_policy_learns_and_its_critic_fits_the_returns(tmp_path, one_thread):
    """The real Policy (DeepSpeed on CPU) with a critic: the reward rises, the critic's
    explained variance becomes positive, 4 epochs × 2 mini-batches = 8 optimizer steps a
    step, and a checkpoint restores policy and critic alike."""
    from services.learner.model.policy import Policy

    tiny_qwen2().save_pretrained(tmp_path / "m")
    train = TrainConfig(
        lr=2e-3,
        estimator="ppo",
        micro_batch_paths=16,
        ppo={"epochs": 4, "minibatches": 2, "value_lr": 5e-3},
    )
    policy = Policy(str(tmp_path / "m"), train)
    gen = torch.Generator().manual_seed(0)
    outs = [policy.update(sample_groups(policy.model, gen)) for _ in range(12)]
    assert all(o["learner/optimizer_steps"] == 8 for o in outs)
    first = sum(o["learner/reward_mean"] for o in outs[:3]) / 3
    last = sum(o["learner/reward_mean"] for o in outs[-3:]) / 3
    assert last > first + 0.05, (first, last)
    assert outs[0]["learner/explained_variance"] <= 0.05  # a zero head predicts nothing
    assert max(o["learner/explained_variance"] for o in outs[-4:]) > 0.1
    assert all(torch.isfinite(torch.tensor(o["learner/value_loss"])) for o in outs)

    policy.save_checkpoint(str(tmp_path / "ck"), "t1", {})
    groups = sample_groups(policy.model, gen)
    chunks, _ = policy._chunks_with_advantages(groups, train)
    before = [v.old_values for v in chunks]
    policy.update(groups)  # moves the critic
    policy.load_checkpoint(str(tmp_path / "ck"), "t1")
    again, _ = policy._chunks_with_advantages(groups, train)
    for a, b in zip(before, again):
        assert torch.equal(a, b.old_values)


@pytest.mark.slow
def test_ppo_with_the_kl_in_the_reward(tmp_path, one_thread):
    from services.learner.model.policy import Policy

    tiny_qwen2().save_pretrained(tmp_path)
    train = TrainConfig(lr=2e-3, estimator="ppo", kl_coef=0.5, kl_in="reward", ppo={"epochs": 2})
    policy = Policy(str(tmp_path), train)
    gen = torch.Generator().manual_seed(0)
    outs = [policy.update(sample_groups(policy.model, gen)) for _ in range(4)]
    assert outs[0]["learner/kl"] == pytest.approx(0.0, abs=1e-6)  # starts at the reference
    assert outs[-1]["learner/kl"] > 0  # moved away; measured before each update
    assert all(o["learner/kl_coef"] == 0.5 for o in outs)


def test_ppo_with_the_kl_in_the_loss_measures_and_applies_it(tmp_path, one_thread):
    """kl_in loss under ppo: the KL term reaches the loss (its advantages hold no KL), so the
    measured KL is reported and moves the adaptive coefficient."""
    from services.learner.model.policy import Policy

    tiny_qwen2().save_pretrained(tmp_path)
    train = TrainConfig(
        lr=5e-3,
        estimator="ppo",
        kl_coef=0.5,
        kl_control={"kind": "adaptive", "target": 1e-6, "horizon": 10},
        ppo={"epochs": 1},
    )
    policy = Policy(str(tmp_path), train)
    gen = torch.Generator().manual_seed(0)
    outs = [policy.update(sample_groups(policy.model, gen)) for _ in range(3)]
    assert 0 < outs[0]["learner/kl"] < 0.05  # from the reference on, over the mini-batches
    assert outs[-1]["learner/kl"] > 0
    assert outs[-1]["learner/kl_coef"] > 0.5  # the controller saw a KL above its target


def test_ppo_refuses_tis():
    with pytest.raises(ValueError, match="off_policy clip"):
        TrainConfig(estimator="ppo", off_policy="tis")


def test_reinforce_pp_normalises_reward_and_kl_penalty_together():
    """REINFORCE++ with the KL in the reward (advantages.compute: V = 0, gamma = lam = 1):
    A_it = whiten over the step of (R_i - mean_group R) - beta * sum_{t' >= t} k_it'."""
    from services.learner.algo.advantages import AdvantageInputs, ChunkTokens, compute
    from services.learner.model.batch import build_batches, group_rewards
    from tests.unit.services.learner.algo.test_estimators import make_group

    groups = [make_group("a", [1, 2, 3], [1.0, 0.0, 0.0]), make_group("b", [4, 2], [0.0, 1.0])]
    zeros = [torch.zeros(len(g.paths)) for g in groups]
    chunks = build_batches(groups, zeros, pad_id=0, max_paths=2)  # groups cut into chunks
    centred = {0: [2 / 3, -1 / 3, -1 / 3], 1: [-0.5, 0.5]}
    tokens = [  # a known per-token KL: 0.1 * (token id)
        ChunkTokens(
            c.group_index, c.path_index, c.loss_mask, c.weight, kl=0.1 * c.targets.float()
        )
        for c in chunks
    ]
    inputs = AdvantageInputs(
        "reinforce_pp",
        [group_rewards(g) for g in groups],
        kl_in_reward=True,
        kl_coef=0.5,
        chunks=tokens,
    )
    out = compute(inputs)
    raw = []
    for c in chunks:
        r = [centred[c.group_index][i] for i in c.path_index.tolist()]
        for row in range(len(c)):
            ks = [0.1 * t for t, m in zip(c.targets[row].tolist(), c.loss_mask[row]) if m]
            raw += [r[row] - 0.5 * sum(ks[t:]) for t in range(len(ks))]
    want = gae.whiten_reference(raw)
    got = [
        float(a)
        for c, adv in zip(chunks, out.per_token)
        for row in range(len(c))
        for a in adv[row][c.loss_mask[row] != 0]
    ]
    assert got == pytest.approx(want, abs=1e-5)
    assert out.returns is None and out.values is None  # no critic
    assert out.stats["learner/kl"] > 0
    assert out.per_path == []  # token level: no per-path advantages
