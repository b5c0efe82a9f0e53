"""Group-relative advantages for wide groups (GRPO / BroRL baselines).

rewards (P, G): P prompts, G sampled paths each (G up to 1024 and beyond).

    adv[p, g]     = (r[p, g] - mean_g r[p]) / (std_g r[p] + eps)     (normalize_std=True)
                  =  r[p, g] - mean_g r[p]                           (normalize_std=False)
    degenerate[p] = all r[p, :] equal  ->  adv[p, :] == 0 exactly

std is the sample standard deviation (Bessel-corrected, torch.std's default), as in
GRPO implementations; a group of one path is degenerate. Results are float32 (float64
for float64 rewards on the PyTorch path). No gradient: rewards are data.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.dispatch import LazyKernel, next_power_of_2, use_triton

_MAX_TRITON_G = 16384  # a whole group lives in one program's registers; wider groups use PyTorch


def group_advantages_reference(
    rewards: torch.Tensor, normalize_std: bool = True, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch (the test oracle, and the CPU path: it is already O(P*G) memory)."""
    r = rewards.to(torch.promote_types(rewards.dtype, torch.float32))  # (P, G)
    G = r.shape[1]
    adv = r - r.mean(dim=1, keepdim=True)  # (P, G)
    if normalize_std and G > 1:
        adv = adv / (r.std(dim=1, keepdim=True) + eps)
    degenerate = (r == r[:, :1]).all(dim=1)  # (P,)
    adv = adv.masked_fill(degenerate.unsqueeze(1), 0.0)
    return adv, degenerate


def _group_adv_kernel(
    r_ptr,
    adv_ptr,
    deg_ptr,
    P,
    G,
    stride_p,
    eps,
    inv_dof,
    NORMALIZE: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    # Each program normalises BLOCK_P whole groups held in registers: (BLOCK_P, BLOCK_G).
    rows = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)  # (BLOCK_P,)
    cols = tl.arange(0, BLOCK_G)  # (BLOCK_G,)
    row_ok = rows < P
    valid = row_ok[:, None] & (cols < G)[None, :]
    rows64 = rows.to(tl.int64)
    r = tl.load(r_ptr + rows64[:, None] * stride_p + cols[None, :], mask=valid, other=0.0).to(
        tl.float32
    )
    mean = tl.sum(r, axis=1) / G  # (BLOCK_P,)
    d = tl.where(valid, r - mean[:, None], 0.0)
    r_max = tl.max(tl.where(valid, r, float("-inf")), axis=1)
    r_min = tl.min(tl.where(valid, r, float("inf")), axis=1)
    degenerate = r_max == r_min  # (BLOCK_P,)
    if NORMALIZE:
        var = tl.sum(d * d, axis=1) * inv_dof  # inv_dof = 1 / max(G - 1, 1)
        adv = d / (tl.sqrt(var)[:, None] + eps)
    else:
        adv = d
    adv = tl.where(degenerate[:, None], 0.0, adv)
    tl.store(adv_ptr + rows64[:, None] * G + cols[None, :], adv, mask=valid)
    tl.store(deg_ptr + rows, degenerate.to(tl.int8), mask=row_ok)


_kernel = LazyKernel(_group_adv_kernel)


def _group_advantages_triton(rewards: torch.Tensor, normalize_std: bool, eps: float):
    P, G = rewards.shape
    if rewards.stride(1) != 1:
        rewards = rewards.contiguous()
    adv = torch.empty((P, G), dtype=torch.float32, device=rewards.device)  # (P, G)
    deg = torch.empty((P,), dtype=torch.int8, device=rewards.device)  # (P,)
    block_g = next_power_of_2(G)
    block_p = max(1, min(next_power_of_2(P), 4096 // block_g))  # ~4K elements per program
    warps = 8 if block_p * block_g >= 4096 else 4
    if P > 0 and G > 0:
        _kernel[(triton.cdiv(P, block_p),)](
            rewards,
            adv,
            deg,
            P,
            G,
            rewards.stride(0),
            float(eps),
            1.0 / max(G - 1, 1),
            NORMALIZE=bool(normalize_std),
            BLOCK_P=block_p,
            BLOCK_G=block_g,
            num_warps=warps,
        )
    return adv, deg.bool()


def group_advantages(
    rewards: torch.Tensor, normalize_std: bool = True, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-path advantages (P, G) and the mask (P,) of groups whose rewards are all equal."""
    if rewards.dim() != 2 or rewards.shape[1] < 1:
        raise ValueError(f"want rewards (P, G) with G >= 1, got shape {tuple(rewards.shape)}")
    if not rewards.is_floating_point():
        rewards = rewards.float()
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if use_triton(rewards) and rewards.shape[1] <= _MAX_TRITON_G:
        return _group_advantages_triton(rewards, normalize_std, eps)
    return group_advantages_reference(rewards, normalize_std, eps)
