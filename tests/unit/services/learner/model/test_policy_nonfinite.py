"""A non-finite loss or gradient skips the update: the real Policy (DeepSpeed on CPU, a tiny
Qwen2) keeps its weights and its optimizer state, and never saves NaN weights for workers."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from brorl.config.train import TrainConfig
from brorl.v1 import common_pb2
from tests.unit.services.learner.tiny_model import tiny_qwen2

pytestmark = pytest.mark.slow


def groups(count: int = 2) -> list[common_pb2.PathGroup]:
    out = []
    for k in range(count):
        g = common_pb2.PathGroup(group_id=f"g{k}", prompt_token_ids=[3, 4, 5])
        for i in range(4):
            g.paths.add(
                path_id=f"g{k}/{i}",
                token_ids=[6 + i, 7],
                logprobs=[-2.0, -2.0],
                reward=float(i % 2),
                sampling=common_pb2.SamplingParams(n=4, temperature=1.0, top_k=-1, top_p=1.0),
            )
        out.append(g)
    return out


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    from services.learner.model.policy import Policy

    model_dir = tmp_path_factory.mktemp("tiny")
    tiny_qwen2().save_pretrained(model_dir)
    policy = Policy(str(model_dir), TrainConfig(lr=1e-2))
    policy.update(groups())  # the optimizer has state from here on
    return policy


def snapshot(policy):
    return (
        {n: p.detach().clone() for n, p in policy.model.named_parameters()},
        copy.deepcopy(policy.engine.optimizer.state_dict()),
    )


def assert_untouched(policy, before) -> None:
    params, opt = before
    for n, p in policy.model.named_parameters():
        assert torch.equal(p, params[n]), n
        assert p.grad is None, n
    after = policy.engine.optimizer.state_dict()
    assert after["state"].keys() == opt["state"].keys()
    for k, state in opt["state"].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(after["state"][k][name]), torch.as_tensor(value))


def test_a_nan_loss_skips_the_update(policy, monkeypatch):
    from services.learner.model import policy as policy_module

    real = policy_module.policy_loss

    def nan_loss(*args, **kwargs):
        loss, stats = real(*args, **kwargs)
        return loss * math.nan, stats

    before = snapshot(policy)
    monkeypatch.setattr(policy_module, "policy_loss", nan_loss)
    out = policy.update(groups())
    assert out["learner/skipped_step"] == 1.0 and out["learner/skipped_nonfinite_loss"] == 1.0
    assert_untouched(policy, before)


def test_an_inf_gradient_skips_the_update(policy):
    before = snapshot(policy)
    param = next(policy.model.parameters())
    hook = param.register_hook(lambda g: g * math.inf)
    try:
        out = policy.update(groups())
    finally:
        hook.remove()
    assert out["learner/skipped_step"] == 1.0 and out["learner/skipped_nonfinite_grad"] == 1.0
    assert_untouched(policy, before)


def test_a_finite_update_after_a_skip_moves_the_weights(policy):
    params, _ = snapshot(policy)
    out = policy.update(groups())
    assert "learner/skipped_step" not in out
    assert any(not torch.equal(p, params[n]) for n, p in policy.model.named_parameters())


def test_nan_weights_are_never_saved_for_publication(policy, tmp_path):
    from brorl.weights.store import WeightStore
    from services.learner.publish import WeightPublisher

    store = WeightStore(tmp_path / "weights")
    publisher = WeightPublisher(store, "bf16", keyframe_every=4)
    pointers = []
    publisher.publish(policy.weights, pointers.append, version=0, step=0)
    param = next(policy.model.parameters())
    saved = param.detach().clone()
    with torch.no_grad():
        param[0] = math.nan
    try:
        with pytest.raises(FloatingPointError, match="non-finite weights"):
            publisher.publish(policy.weights, pointers.append, version=1, step=1)
    finally:
        with torch.no_grad():
            param.copy_(saved)
    assert [p.version for p in pointers] == [0]
    assert sorted(d.name for d in (tmp_path / "weights").glob("v*")) == ["v00000000"]
