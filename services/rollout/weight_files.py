"""Weight sources of the rollout engine's in-place reload, without vLLM: the HF-named tensors
of a directory of ``*.safetensors`` files or of a serving state (brorl.weights.chain), and the
filter that tells a complete reload from a partial one (services/rollout/engine.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np


def safetensors_files(weights_dir: str) -> list[Path]:
    files = sorted(Path(weights_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in weights dir {weights_dir!r}")
    return files


def safetensors_keys(files: list[Path]) -> set[str]:
    from safetensors import safe_open

    keys: set[str] = set()
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            keys.update(f.keys())
    return keys


def iter_safetensors(files: list[Path]):
    """Yield (HF name, tensor) pairs from safetensors files, one tensor at a time."""
    from safetensors import safe_open

    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def serving_tensors(state):
    """(HF name, tensor) pairs viewing a ServingState's bits as their dtype (no copy; vLLM's
    weight loaders copy them into the engine's parameters, casting to the engine dtype: bf16
    bits become their exact fp32 values in an fp32 engine)."""
    import torch

    view = {"bf16": (np.int16, torch.bfloat16), "fp32": (np.int32, torch.float32)}[state.dtype]
    for name, bits in state.tensors.items():
        yield name, torch.from_numpy(bits.view(view[0])).view(view[1])


def packed_sources(module: str, param: str, packed: dict[str, list[str]]) -> list[str]:
    """The HF tensor names one engine parameter is made of, in the order they are stacked along
    dim 0: a packed module (``qkv_proj`` from ``q_proj``, ``k_proj``, ``v_proj``, as a vLLM
    model's ``packed_modules_mapping`` says) takes its parts' tensors, any other parameter the
    tensor of its own name."""
    parent, _, leaf = module.rpartition(".")
    if leaf in packed:
        base = f"{parent}." if parent else ""
        return [f"{base}{part}.{param}" for part in packed[leaf]]
    return [f"{module}.{param}" if module else param]


LAYERWISE_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class FailedLayerFilter(logging.Filter):
    """Catches vLLM's per-reload "<Layer>: Failed to load weights" warnings.

    vLLM warns for every layer that received no checkpoint tensor. Two are expected on every
    reload (rotary embeddings hold only a computed buffer; a tied LM head shares the
    embedding's weight): those are dropped. Any other layer means the weights dir did not
    cover the model; it is recorded so that the reload can fail loudly.
    """

    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.tied = tied
        self.unexpected: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if "Failed to load weights" not in str(record.msg):
            return True
        layer = str(record.args[0]) if record.args else record.getMessage()
        if "Rotary" in layer or (self.tied and layer == "ParallelLMHead"):
            return False
        self.unexpected.append(layer)
        return True


def lm_head_is_tied(model) -> bool:
    lm_head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    return (
        lm_head is not None
        and embed is not None
        and getattr(lm_head, "weight", None) is getattr(embed, "weight", False)
    )
