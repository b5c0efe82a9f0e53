"""Whether the learner's forward runs under bf16 autocast on its device (``train.autocast``).

A CPU with AVX512-BF16 or AMX multiplies bf16 natively (the long shape's forward 1.9x fp32
there); elsewhere bf16 is emulated and slower than fp32 (docs/performance.md, "The learner's
forward in bf16 on the CPU")."""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


def autocast_enabled(setting: str, device: torch.device) -> bool:
    """Whether the forward runs under bf16 autocast (TrainConfig.autocast: 'auto' is bf16 on
    CUDA only, 'native' on CUDA and on a CPU with native bf16). bf16 on a CPU without native bf16
    instructions is emulated: it runs, slowly."""
    if setting == "native":
        return device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16())
    on = setting == "bf16" or (setting == "auto" and device.type == "cuda")
    if on and device.type == "cpu" and not cpu_has_native_bf16():
        log.warning(
            "train.autocast bf16 on a CPU without native bf16 (AVX512-BF16 or AMX): the "
            "forward is emulated and slower than fp32"
        )
    return on


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX tiles). oneDNN's own check
    also accepts plain AVX512, where a bf16 forward is converted and 2.3x slower than fp32."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)
