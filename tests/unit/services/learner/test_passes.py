"""Several optimizer steps on one step's paths for the critic-free estimators (``train.epochs``,
``train.minibatches``; ``TrainConfig.passes`` says which section applies): the config's rules
and the real Policy (DeepSpeed on CPU, a tiny Qwen2).

Mutation tried, failing these tests: policy.update taking its passes from ``train.ppo`` only
when a critic exists (the old rule: one optimizer step whatever train.epochs says)."""

from __future__ import annotations

import pytest
import torch

from brorl.config.train import TrainConfig
from tests.unit.services.learner.algo.test_adaptive_kl import sample_groups
from tests.unit.services.learner.tiny_model import tiny_qwen2


def test_passes_have_one_owner_per_estimator():
    assert TrainConfig().passes() == (1, 1)
    assert TrainConfig(epochs=2, minibatches=3).passes() == (2, 3)
    assert TrainConfig(estimator="rloo", minibatches=4).passes() == (1, 4)
    assert TrainConfig(estimator="ppo").passes() == (4, 2)  # train.ppo's defaults
    assert TrainConfig(estimator="ppo", ppo={"epochs": 1, "minibatches": 1}).passes() == (1, 1)


@pytest.mark.parametrize("off_policy", ["tis", "none"])
def test_several_passes_need_the_clip(off_policy):
    TrainConfig(off_policy=off_policy)  # one pass: any correction
    with pytest.raises(ValueError, match="off_policy clip"):
        TrainConfig(epochs=2, off_policy=off_policy)
    with pytest.raises(ValueError, match="off_policy clip"):
        TrainConfig(minibatches=2, off_policy=off_policy)


def test_ppo_takes_its_own_passes():
    with pytest.raises(ValueError, match="train.ppo.epochs"):
        TrainConfig(estimator="ppo", epochs=2)


def test_grpo_makes_epochs_times_minibatches_optimizer_steps(tmp_path, one_thread):
    """The same groups, one pass vs 2 epochs x 2 mini-batches: 4 optimizer steps, and the
    weights move further (each step's clipped ratio is against the sampler's log-probs)."""
    from services.learner.model.policy import Policy

    tiny_qwen2().save_pretrained(tmp_path)
    start = {k: v.detach().clone() for k, v in tiny_qwen2().named_parameters()}

    def moved(policy) -> float:
        now = dict(policy.model.named_parameters())
        return sum(float((now[k].detach() - v).norm()) for k, v in start.items())

    one = Policy(str(tmp_path), TrainConfig(lr=2e-3, micro_batch_paths=8))
    groups = sample_groups(one.model, torch.Generator().manual_seed(0))
    out = one.update(groups)
    several = Policy(
        str(tmp_path), TrainConfig(lr=2e-3, micro_batch_paths=8, epochs=2, minibatches=2)
    )
    outs = several.update(groups)
    assert out["learner/optimizer_steps"] == 1
    assert outs["learner/optimizer_steps"] == 4
    assert outs["learner/chunks"] == out["learner/chunks"] == 8  # 4 groups of 16, 8 a chunk
    assert moved(several) > 2 * moved(one) > 0
    # the later optimizer steps see the policy moved away from the sampler's log-probs
    assert outs["learner/logp_gap"] > out["learner/logp_gap"]


def test_the_update_calls_its_hook_before_every_chunk_of_every_pass(tmp_path, one_thread):
    """The trainer's hook (cores.CoreBorrowing.refresh) runs before each chunk's forward."""
    from services.learner.model.policy import Policy

    tiny_qwen2().save_pretrained(tmp_path)
    policy = Policy(str(tmp_path), TrainConfig(micro_batch_paths=8, epochs=2, minibatches=2))
    calls = []
    policy.before_chunk = lambda: calls.append(1)
    out = policy.update(sample_groups(policy.model, torch.Generator().manual_seed(0)))
    assert out["learner/chunks"] > 1 and len(calls) == 2 * out["learner/chunks"]
