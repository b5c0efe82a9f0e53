"""The learner step on CUDA (skipped without it): the same loss and gradients as on the CPU
within bf16 tolerance, batches and the reference model on the engine's device, and a real
Policy.update through DeepSpeed on the GPU.

Run on a GPU machine: ``python -m pytest -m gpu tests/unit/services/learner -q``
(scripts/gpu_check.sh installs DeepSpeed from carried wheels first).
"""

from __future__ import annotations

import copy

import pytest
import torch

from brorl.config.train import TrainConfig
from services.learner.model.batch import advantages_of, build_batches
from tests.unit.services.learner.model.test_policy_nonfinite import groups
from tests.unit.services.learner.tiny_model import tiny_qwen2

pytestmark = pytest.mark.gpu


def loss_and_grads(model, chunk, train, ref=None, autocast=False):
    from services.learner.model.losses import policy_loss

    model.zero_grad(set_to_none=True)
    device = next(model.parameters()).device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        loss, _ = policy_loss(model, chunk.to(device), train, ref)
    loss.backward()
    return float(loss), torch.cat([p.grad.float().flatten().cpu() for p in model.parameters()])


def assert_within_bf16(loss_ref, grads_ref, loss, grads) -> None:
    """A bf16-autocast loss and gradients against the fp32 ones: within bf16's tolerance."""
    assert loss == pytest.approx(loss_ref, rel=3e-2, abs=3e-3)
    cos = torch.nn.functional.cosine_similarity(grads_ref, grads, dim=0)
    assert cos > 0.99, float(cos)
    assert (grads.norm() / grads_ref.norm()).item() == pytest.approx(1.0, rel=5e-2)


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_cuda_loss_and_gradients_match_the_cpu_within_bf16(kl_coef):
    train = TrainConfig(kl_coef=kl_coef)
    gs = groups(3)
    chunks = build_batches(gs, advantages_of(gs, True, "grpo"), pad_id=0, max_paths=3)
    cpu = tiny_qwen2()
    gpu = copy.deepcopy(cpu).cuda()
    ref_cpu = copy.deepcopy(cpu) if kl_coef else None
    ref_gpu = copy.deepcopy(gpu) if kl_coef else None
    for chunk in chunks:
        l_cpu, g_cpu = loss_and_grads(cpu, chunk, train, ref_cpu)
        l_gpu, g_gpu = loss_and_grads(gpu, chunk, train, ref_gpu, autocast=True)
        assert_within_bf16(l_cpu, g_cpu, l_gpu, g_gpu)


def test_group_advantages_run_on_the_device_and_come_back_to_the_cpu():
    gs = groups(4)
    on_gpu = advantages_of(gs, True, "grpo", device=torch.device("cuda"))
    on_cpu = advantages_of(gs, True, "grpo")
    assert all(a.device.type == "cpu" for a in on_gpu)
    for a, b in zip(on_gpu, on_cpu):
        assert torch.allclose(a, b, atol=1e-5)


def test_policy_update_runs_on_the_gpu(tmp_path):
    from services.learner.model.policy import Policy

    tiny_qwen2().save_pretrained(tmp_path)
    policy = Policy(str(tmp_path), TrainConfig(lr=1e-2, kl_coef=0.05))
    assert policy.device.type == "cuda" and policy.autocast
    assert next(policy.ref_model.parameters()).device.type == "cuda"
    before = [p.detach().clone() for p in policy.model.parameters()]
    out = policy.update(groups())
    assert not out.get("learner/skipped_step")
    assert all(torch.isfinite(torch.tensor(v)) for v in out.values())
    moved = max(
        (p.detach() - b).abs().max().item() for p, b in zip(policy.model.parameters(), before)
    )
    assert moved > 0
