"""train.autocast on the CPU: 'bf16' runs the learner's forward in bf16 (the master weights stay
fp32) with the fp32 loss and gradients within bf16 tolerance; 'auto' and 'fp32' keep fp32 there."""

from __future__ import annotations

import copy

import pytest
import torch
from pydantic import ValidationError

from brorl.config.train import TrainConfig
from services.learner.model.batch import advantages_of, build_batches
from services.learner.model.autocast import autocast_enabled
from services.learner.model.policy import Policy
from tests.unit.services.learner.model.test_policy_cuda import (
    assert_within_bf16,
    loss_and_grads,
)
from tests.unit.services.learner.model.test_policy_nonfinite import groups
from tests.unit.services.learner.tiny_model import tiny_qwen2


@pytest.mark.parametrize(
    "setting, device, on",
    [
        ("auto", "cpu", False),
        ("auto", "cuda", True),
        ("bf16", "cpu", True),
        ("bf16", "cuda", True),
        ("fp32", "cpu", False),
        ("fp32", "cuda", False),
    ],
)
def test_the_setting_resolves_per_device(setting, device, on):
    assert autocast_enabled(setting, torch.device(device)) is on


@pytest.mark.parametrize("native", [False, True])
def test_native_takes_bf16_only_where_the_cpu_has_it(monkeypatch, caplog, native):
    """'native' (the long shape's): bf16 on CUDA and on a CPU with AVX512-BF16 or AMX, fp32 on
    any other CPU, and no emulation warning either way."""
    from services.learner.model import autocast

    monkeypatch.setattr(autocast, "cpu_has_native_bf16", lambda: native)
    assert autocast_enabled("native", torch.device("cpu")) is native
    assert autocast_enabled("native", torch.device("cuda")) is True
    assert caplog.text == ""
    assert TrainConfig(autocast="native").autocast == "native"


def test_an_unknown_dtype_is_refused():
    assert TrainConfig().autocast == "auto"
    with pytest.raises(ValidationError, match="autocast"):
        TrainConfig(autocast="fp16")


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_bf16_loss_and_gradients_match_fp32_within_bf16(kl_coef):
    train = TrainConfig(kl_coef=kl_coef)
    gs = groups(3)
    chunks = build_batches(gs, advantages_of(gs, True, "grpo"), pad_id=0, max_paths=3)
    fp32 = tiny_qwen2()
    bf16 = copy.deepcopy(fp32)
    ref = copy.deepcopy(fp32) if kl_coef else None
    for chunk in chunks:
        l32, g32 = loss_and_grads(fp32, chunk, train, ref)
        l16, g16 = loss_and_grads(bf16, chunk, train, ref, autocast=True)
        assert l16 != l32  # the forward did run in bf16
        assert_within_bf16(l32, g32, l16, g16)


@pytest.mark.slow
@pytest.mark.parametrize("setting, dtype", [("bf16", torch.bfloat16), ("auto", torch.float32)])
def test_a_policy_update_runs_its_forward_in_the_chosen_dtype(tmp_path, setting, dtype):
    tiny_qwen2().save_pretrained(tmp_path)
    policy = Policy(str(tmp_path), TrainConfig(lr=1e-2, autocast=setting))
    seen = []
    layer = policy.model.model.layers[0].mlp.down_proj
    layer.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    before = [p.detach().clone() for p in policy.model.parameters()]
    out = policy.update(groups())
    assert not out.get("learner/skipped_step")
    assert seen and set(seen) == {dtype}
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())
    moved = max(
        (p.detach() - b).abs().max().item() for p, b in zip(policy.model.parameters(), before)
    )
    assert moved > 0


def test_bf16_on_a_cpu_without_native_bf16_warns(monkeypatch, caplog):
    from services.learner.model import autocast

    monkeypatch.setattr(autocast, "cpu_has_native_bf16", lambda: False)
    assert autocast_enabled("bf16", torch.device("cpu"))
    assert "without native bf16" in caplog.text
    caplog.clear()
    monkeypatch.setattr(autocast, "cpu_has_native_bf16", lambda: True)
    assert autocast_enabled("bf16", torch.device("cpu"))
    assert autocast_enabled("auto", torch.device("cpu")) is False
    assert caplog.text == ""


@pytest.mark.slow
def test_the_warm_forward_runs_in_the_updates_dtype_and_changes_nothing(tmp_path):
    """Policy.warm_forward: a forward under the update's autocast that leaves the weights, their
    gradients, the train mode and the global RNG as they were (a run's randomness must not depend
    on whether its first forward was warmed)."""
    tiny_qwen2().save_pretrained(tmp_path)
    policy = Policy(str(tmp_path), TrainConfig(autocast="bf16"))
    seen = []
    layer = policy.model.model.layers[0].mlp.down_proj
    layer.register_forward_hook(lambda _m, _i, out: seen.append((out.dtype, tuple(out.shape))))
    before = [p.detach().clone() for p in policy.model.parameters()]
    policy.model.train()
    rng = torch.get_rng_state()
    positions = policy.model.config.max_position_embeddings
    assert policy.warm_forward(3, positions + 50) > 0
    assert seen == [(torch.bfloat16, (3, positions, layer.out_features))]  # capped at the model's
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(p, b) for p, b in zip(policy.model.parameters(), before))
    assert all(p.grad is None for p in policy.model.parameters())
    assert policy.model.training
