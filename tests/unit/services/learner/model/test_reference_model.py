"""The reference model: loaded once, only when the KL has a weight, frozen, and run once per
chunk for both the KL term (loss or reward) and its metric."""

from __future__ import annotations

import pytest
import torch

from brorl.config.train import TrainConfig
from tests.unit.services.learner.model.test_policy_nonfinite import groups
from tests.unit.services.learner.tiny_model import tiny_qwen2

pytestmark = pytest.mark.slow


@pytest.fixture
def loads(monkeypatch):
    """Model directories AutoModelForCausalLM.from_pretrained was called with."""
    from transformers import AutoModelForCausalLM

    seen: list[str] = []
    real = AutoModelForCausalLM.from_pretrained.__func__

    def counting(cls, path, *args, **kwargs):
        seen.append(str(path))
        return real(cls, path, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(counting))
    return seen


def test_no_reference_model_without_a_kl_weight(tmp_path, loads):
    from services.learner.model.policy import Policy

    tiny_qwen2().save_pretrained(tmp_path)
    policy = Policy(str(tmp_path), TrainConfig(kl_coef=0.0, kl_in="reward"))
    assert loads == [str(tmp_path)] and policy.ref_model is None
    out = policy.update(groups())
    assert out["learner/kl"] == 0.0 and "learner/kl_coef" not in out


@pytest.mark.parametrize("kl_in", ["loss", "reward"])
def test_the_reference_is_loaded_once_and_runs_once_per_chunk(tmp_path, loads, kl_in):
    from services.learner.model.policy import Policy

    tiny_qwen2().save_pretrained(tmp_path)
    policy = Policy(str(tmp_path), TrainConfig(kl_coef=0.1, kl_in=kl_in, micro_batch_paths=3))
    assert loads == [str(tmp_path)] * 2  # the policy and its reference, nothing more
    ref = policy.ref_model
    assert not any(p.requires_grad for p in ref.parameters()) and not ref.training
    before = {n: p.detach().clone() for n, p in ref.named_parameters()}
    calls = []
    ref.register_forward_hook(lambda *_: calls.append(1))
    for _ in range(3):
        out = policy.update(groups())  # 2 groups of 4 paths, chunks of <= 3: 4 chunks
    # the reference runs each group's prompt once (prompt_once.py), then every chunk's
    # continuation of it
    assert len(calls) == 3 * (2 + 4)
    assert out["learner/kl"] > 0 and out["learner/kl_coef"] == 0.1
    assert all(torch.equal(p, before[n]) for n, p in ref.named_parameters())
    assert loads == [str(tmp_path)] * 2
