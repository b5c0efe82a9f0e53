"""Advantage estimators (services/learner/algo/advantages.py) on hand-worked numbers, against their
float64 twins, and the estimator choice reaching the update from a RunConfig."""

import math
from types import SimpleNamespace

import pytest
import torch

from brorl.config.run import RunConfig
from brorl.v1 import common_pb2
from kernels import group_advantages
from services.learner.algo import advantages as estimators
from services.learner.algo.advantages import AdvantageInputs, compute
from services.learner.algo.advantages import group_estimate_reference as advantages_reference
from services.learner.algo.kl_control import KLController
from services.learner.model import policy
from services.learner.model.batch import advantages_of

EPS = estimators.EPS


def advantages(rewards: list[torch.Tensor], estimator: str, normalize_std: bool = True):
    """The (G,) per-group advantages through the one entry point (advantages.compute)."""
    return compute(AdvantageInputs(estimator, rewards, normalize_std=normalize_std)).per_path


def run(groups, estimator, normalize_std=True):
    """Both implementations on the same rewards; they must agree; returns the tensor one."""
    got = advantages([torch.tensor(g) for g in groups], estimator, normalize_std)
    ref = advantages_reference(groups, estimator, normalize_std)
    assert [len(a) for a in got] == [len(g) for g in groups]
    for a, r in zip(got, ref):
        assert a.tolist() == pytest.approx(r, abs=1e-5)
    return [a.tolist() for a in got]


def both(groups, estimator, normalize_std=True):
    """Each implementation separately, so a hand-worked check catches a mutation in either."""
    got = advantages([torch.tensor(g) for g in groups], estimator, normalize_std)
    return [a.tolist() for a in got], advantages_reference(groups, estimator, normalize_std)


# ---- hand-worked numbers ------------------------------------------------------------------
# [1, 0, 0]: mean 1/3, deviations (2/3, -1/3, -1/3), sample var (4/9 + 1/9 + 1/9) / 2 = 1/3,
#            sample std 1/sqrt(3) = 0.57735
# [0, 1]:    mean 1/2, deviations (-1/2, 1/2), sample var (1/4 + 1/4) / 1 = 1/2, std 0.70711
# [3, 1, 2, 2]: mean 2, deviations (1, -1, 0, 0)
S3 = 1 / math.sqrt(3)
S2 = 1 / math.sqrt(2)


def test_grpo_divides_by_the_sample_std():
    for out in both([[1.0, 0.0, 0.0], [0.0, 1.0]], "grpo"):
        # (2/3) / 0.57735 = 1.1547, (-1/3) / 0.57735 = -0.57735; (±1/2) / 0.70711 = ±0.70711
        assert out[0] == pytest.approx([2 / 3 / (S3 + EPS)] + [-1 / 3 / (S3 + EPS)] * 2)
        assert out[0] == pytest.approx([1.1547, -0.57735, -0.57735], abs=1e-4)
        assert out[1] == pytest.approx([-0.70711, 0.70711], abs=1e-4)


def test_grpo_without_std_is_the_centred_reward():
    for out in both([[1.0, 0.0, 0.0]], "grpo", normalize_std=False):
        assert out[0] == pytest.approx([2 / 3, -1 / 3, -1 / 3])


def test_grpo_default_is_todays_kernel_call_exactly():
    torch.manual_seed(0)
    rewards = torch.rand(5, 8)  # (P, G)
    for norm in (True, False):
        want, _ = group_advantages(rewards, normalize_std=norm)
        got = advantages(list(rewards), "grpo", norm)
        assert torch.equal(torch.stack(got), want)


def test_dr_grpo_never_divides_by_std():
    # normalize_std=True is ignored: (2/3, -1/3, -1/3) and (-1/2, 1/2), not 1.1547 / 0.70711
    for out in both([[1.0, 0.0, 0.0], [0.0, 1.0]], "dr_grpo", normalize_std=True):
        assert out[0] == pytest.approx([2 / 3, -1 / 3, -1 / 3])
        assert out[1] == pytest.approx([-0.5, 0.5])


def test_rloo_leaves_each_path_out_of_its_baseline():
    for out in both([[1.0, 0.0, 0.0], [0.0, 1.0], [3.0, 1.0, 2.0, 2.0]], "rloo"):
        # 1 - mean(0, 0) = 1;  0 - mean(1, 0) = -1/2  (= 3/2 * (2/3, -1/3, -1/3))
        assert out[0] == pytest.approx([1.0, -0.5, -0.5])
        # 0 - 1 = -1;  1 - 0 = 1
        assert out[1] == pytest.approx([-1.0, 1.0])
        # 3 - (1+2+2)/3 = 4/3;  1 - (3+2+2)/3 = -4/3;  2 - (3+1+2)/3 = 0
        assert out[2] == pytest.approx([4 / 3, -4 / 3, 0.0, 0.0])


def test_reinforce_pp_normalises_over_the_whole_step():
    # centred: (2/3, -1/3, -1/3), (-1/2, 1/2), (0) -> 6 paths, mean 0,
    # sum of squares 4/9 + 1/9 + 1/9 + 1/4 + 1/4 = 7/6, sample var 7/6 / 5 = 7/30,
    # std sqrt(7/30) = 0.483046: 2/3 / 0.483046 = 1.380131, 1/3 -> 0.690066, 1/2 -> 1.035098
    for out in both([[1.0, 0.0, 0.0], [0.0, 1.0], [5.0]], "reinforce_pp"):
        assert out[0] == pytest.approx([1.380131, -0.690066, -0.690066], abs=1e-5)
        assert out[1] == pytest.approx([-1.035098, 1.035098], abs=1e-5)
        assert out[2] == pytest.approx([0.0], abs=1e-6)  # mean_all is 0 up to rounding
    # the per-group std would give 1.1547 / 0.70711: the global one is what differs
    out = run([[1.0, 0.0, 0.0], [0.0, 1.0]], "reinforce_pp")
    s = math.sqrt((4 / 9 + 1 / 9 + 1 / 9 + 1 / 4 + 1 / 4) / 4)
    assert out[1] == pytest.approx([-0.5 / s, 0.5 / s], abs=1e-5)


# ---- edge cases, every estimator ----------------------------------------------------------


@pytest.mark.parametrize("estimator", estimators.GROUP_ESTIMATORS)
def test_a_lone_path_and_all_equal_rewards_get_zero(estimator):
    out = run([[0.7], [2.0, 2.0, 2.0], [0.1, 0.1]], estimator)
    assert out == [[0.0], [0.0, 0.0, 0.0], [0.0, 0.0]]  # exactly zero
    assert run([[0.7]], estimator) == [[0.0]]
    assert run([], estimator) == []


@pytest.mark.parametrize("estimator", estimators.GROUP_ESTIMATORS)
def test_irregular_group_sizes_in_one_step_match_the_reference(estimator):
    groups = [[1.0, 0.0, 0.0], [0.0, 1.0], [0.3], [3.0, 1.0, 2.0, 2.0], [0.0, 1.0, 1.0]]
    for norm in (True, False):
        run(groups, estimator, norm)
    torch.manual_seed(1)
    sizes = [1, 2, 3, 8, 8, 5, 2]
    groups = [torch.rand(n).round(decimals=1).tolist() for n in sizes]
    run(groups, estimator)


def test_unknown_estimator_is_refused():
    with pytest.raises(ValueError, match="unknown estimator"):
        advantages([torch.tensor([1.0, 0.0])], "nope")
    with pytest.raises(ValueError, match="unknown estimator 'ppo'"):  # not a group-level one
        estimators.group_estimate(AdvantageInputs("ppo", [torch.tensor([1.0, 0.0])]))


def test_every_configurable_estimator_is_implemented():
    """The run config's names (brorl/config/train.py, their one owner) are this module's."""
    from brorl.config.train import ESTIMATORS

    assert set(ESTIMATORS) == set(estimators.GROUP_ESTIMATORS) | {"ppo"}
    assert estimators.token_level("ppo", False) and estimators.token_level("reinforce_pp", True)
    assert not any(estimators.token_level(e, False) for e in estimators.GROUP_ESTIMATORS)


def test_dr_grpo_divides_the_token_sum_by_a_constant():
    assert estimators.loss_denominator("grpo", 12, 5, 8) == 12.0  # token mean
    assert estimators.loss_denominator("rloo", 12, 5, 8) == 12.0
    assert estimators.loss_denominator("reinforce_pp", 12, 5, 8) == 12.0
    assert estimators.loss_denominator("dr_grpo", 12, 5, 8) == 40.0  # 5 paths x 8 tokens


# ---- RunConfig → Policy.update → advantages_of, without a model or DeepSpeed ---------------


def make_group(gid, lengths, rewards, max_tokens=8):
    g = common_pb2.PathGroup(group_id=gid, prompt_token_ids=[1, 2])
    for i, (n, r) in enumerate(zip(lengths, rewards)):
        g.paths.add(
            path_id=f"{gid}/{i}",
            token_ids=[3] * n,
            logprobs=[-0.5] * n,
            reward=r,
            sampling=common_pb2.SamplingParams(temperature=1.0, max_tokens=max_tokens),
        )
    return g


class FakeEngine:
    def __init__(self):
        self.backward_losses: list[float] = []
        self.boundaries: list[bool] = []
        self.global_steps = 0  # the optimizer's step count (the learning-rate warm-up reads it)
        self.optimizer = SimpleNamespace(param_groups=[{"lr": 0.0}])

    def train(self):
        pass

    def set_gradient_accumulation_boundary(self, last):
        self.boundaries.append(last)

    def backward(self, loss):
        self.backward_losses.append(float(loss))

    def step(self):
        pass

    def zero_optimization_stage(self):
        return 0


@pytest.mark.parametrize("estimator", estimators.GROUP_ESTIMATORS)
def test_the_run_configs_estimator_reaches_the_update(estimator, monkeypatch):
    cfg = RunConfig.model_validate(
        {
            "model": "m",
            "data": {"train_path": "x"},
            # prompt_once off: the fake loss runs no model (test_prompt_once.py covers it)
            "train": {"estimator": estimator, "micro_batch_paths": 2, "prompt_once": False},
        }
    )
    assert RunConfig.model_validate(
        {"model": "m", "data": {"train_path": "x"}}
    ).train.estimator == ("grpo")
    seen = {"estimators": [], "advantages": {}}
    real_compute = policy.advantages.compute

    def spy_compute(inputs):
        seen["estimators"].append(inputs.estimator)
        return real_compute(inputs)

    def fake_loss(engine, chunk, train, ref_model, prompt=None, ref_prompt=None):
        for row, i in enumerate(chunk.path_index.tolist()):
            seen["advantages"][(chunk.group_index, i)] = float(chunk.advantages[row])
        return torch.tensor(1.0), {"clip_frac": 0.5}  # token-mean loss 1 in every chunk

    monkeypatch.setattr(policy.advantages, "compute", spy_compute)
    monkeypatch.setattr(policy, "policy_loss", fake_loss)
    monkeypatch.setattr(policy.deepspeed_engine, "grad_norm", lambda engine: 0.0)
    groups = [make_group("a", [1, 2, 3], [1.0, 0.0, 0.0]), make_group("b", [4, 2], [0.0, 1.0])]
    fake = policy.Policy.__new__(policy.Policy)  # the real update on a fake engine
    fake.__dict__.update(
        train=cfg.train,
        pad_id=0,
        engine=FakeEngine(),
        ref_model=None,
        kl=KLController(cfg.train),
        device=torch.device("cpu"),
        autocast=False,
        rank=0,
        world=1,
        critic=None,
        updates=0,
        base_lr=cfg.train.lr,
    )
    out = policy.Policy.update(fake, groups)

    assert seen["estimators"] == [estimator]
    want = advantages_reference([[1.0, 0.0, 0.0], [0.0, 1.0]], estimator)
    for (gi, i), a in seen["advantages"].items():
        assert a == pytest.approx(want[gi][i], abs=1e-5)
    assert len(seen["advantages"]) == 5
    # 12 tokens over 5 paths sampled with max_tokens 8: token mean -> weights sum to 1;
    # dr_grpo -> the token sum over 5 x 8 = 40, so the weights sum to 12 / 40 = 0.3
    total = 1.0 if estimator != "dr_grpo" else 12 / 40
    assert sum(fake.engine.backward_losses) == pytest.approx(total)
    assert out["learner/loss"] == pytest.approx(total)
    assert fake.engine.boundaries[-1] is True and out["learner/tokens"] == 12.0
    assert out["learner/clip_frac"] == pytest.approx(0.5)  # statistics: token means, any loss


def test_advantages_of_defaults_to_grpo():
    groups = [make_group("a", [1, 1, 1], [1.0, 0.0, 0.0])]
    assert advantages_of(groups, True)[0].tolist() == pytest.approx(
        [1.1547, -0.57735, -0.57735], abs=1e-4
    )
