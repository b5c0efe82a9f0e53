"""What runs inside vLLM's worker process: ``ReloadExtension``, mixed into vLLM's worker class
(``worker_extension_cls``, named by path in services/rollout/engine.py) and called through
``collective_rpc``.

It reloads weights in place (``model_runner.reload_weights``), keeps the serving state of
published versions across calls (brorl.weights.chain), and after every reload rebuilds the CPU
GEMM dispatch of the layers that keep their weight (``_refresh_cpu_gemm_dispatch``; why: the
engine module's docstring).

A published version of an architecture in ``IN_PLACE_ARCHITECTURES`` on CPU skips vLLM's
layerwise reload (``_copy_in_place``): that machinery re-creates every layer on the meta device,
wraps each weight loader and counts the elements loaded, about two thirds of a small model's
reload (skipping it: 36 → 16 ms a version for the demo's model, docs/performance.md). Every
tensor is copied into its parameter (packed ones stacked as ``packed_modules_mapping`` says)
and each linear layer's GEMM is re-packed as vLLM's own post-load step does. Anything it does
not recognise — another architecture, a quantized layer, a name or shape that does not match —
leaves the model untouched and takes the layerwise path.

The driver side (the ``LLM``, sampling, the rollout service's calls) is
services/rollout/engine.py; these two are the only modules that import vllm, one per process.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from services.rollout.weight_files import (
    LAYERWISE_LOGGER,
    FailedLayerFilter,
    iter_safetensors,
    lm_head_is_tied,
    packed_sources,
    safetensors_files,
    serving_tensors,
)

# Models whose vLLM ``load_weights`` only renames and stacks (no permutation, scaling or
# splitting of a tensor): for these a straight copy loads what the layerwise reload loads.
# tests/integration/test_weight_reload_parity.py and test_engine_delta_sync.py check it; add an
# architecture only with such a test.
IN_PLACE_ARCHITECTURES = frozenset({"Qwen2ForCausalLM"})


def _refresh_cpu_gemm_dispatch(model) -> int:
    """Rebuild the CPU GEMM handle of every layer that still owns its weight.

    ``dispatch_cpu_unquantized_gemm`` packs a layer's weight (or builds a oneDNN handle) once
    after loading. Linear layers drop their weight afterwards (``remove_weight=True``) and are
    re-dispatched by the in-place reload; embeddings / LM heads keep it
    (``remove_weight=False``) and a tied ``lm_head`` is never re-processed, so its handle
    still holds the old weight. Re-dispatching from the weight now in place fixes that.
    Returns the number of layers refreshed.
    """
    import torch
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    refreshed = 0
    for module in model.modules():
        if not hasattr(module, "cpu_linear"):
            continue
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.is_meta:
            continue
        if weight.ndim != 2 or weight.numel() == 0:
            continue  # packed linear layers (weight removed) were re-dispatched by the reload
        dispatch_cpu_unquantized_gemm(module, remove_weight=False)
        refreshed += 1
    return refreshed


def _copy_in_place(model, tensors: dict) -> int | None:
    """Load HF-named ``tensors`` (a whole state) into the model without the layerwise reload:
    the number of parameters written, or None — the model untouched — when the model or the
    tensors are not what this path knows (module docstring)."""
    import torch
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    if type(model).__name__ not in IN_PLACE_ARCHITECTURES:
        return None
    packed = dict(getattr(model, "packed_modules_mapping", None) or {})
    tied = lm_head_is_tied(model)
    plan = []  # (module, parameter name, HF names, shape, re-pack, padded rows)
    for mname, module in model.named_modules():
        for pname, param in module.named_parameters(recurse=False):
            if tied and mname == "lm_head":
                continue  # the embedding's weight, written once
            repack = hasattr(module, "cpu_linear") and param.numel() == 0
            if repack:  # vLLM dropped the weight after packing it
                if pname != "weight" or getattr(module, "_cpu_skip_gemm_dispatch", False):
                    return None
                if not isinstance(getattr(module, "quant_method", None), UnquantizedLinearMethod):
                    return None
                shape = (module.output_size_per_partition, module.input_size_per_partition)
            else:
                shape = tuple(param.shape)
            # vLLM pads the vocabulary's rows (to a multiple of 64); the loader zeroes the rest
            padded = isinstance(module, VocabParallelEmbedding)
            names = packed_sources(mname, pname, packed)
            plan.append((module, pname, names, shape, repack, padded))
    if {n for _, _, names, *_ in plan for n in names} != set(tensors):
        return None
    for module, _, names, shape, _, padded in plan:
        parts = [tensors[n].shape for n in names]
        rows = sum(p[0] for p in parts)
        if padded and rows != getattr(module, "org_vocab_size", -1):
            return None
        if any(p[1:] != shape[1:] for p in parts) or not (rows == shape[0] or padded):
            return None
    for module, pname, names, _, repack, _ in plan:
        value = tensors[names[0]] if len(names) == 1 else torch.cat([tensors[n] for n in names])
        if repack:  # as UnquantizedLinearMethod.process_weights_after_loading does on CPU
            dtype = getattr(module, pname).dtype
            module.weight = torch.nn.Parameter(value.to(dtype).contiguous(), requires_grad=False)
            dispatch_cpu_unquantized_gemm(module, remove_weight=True)
        else:
            param = getattr(module, pname)
            param[: value.shape[0]].copy_(value)
            param[value.shape[0] :].zero_()
    return len(plan)


class ReloadExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); runs in the worker process."""

    def brorl_reload_weights(self, weights_dir: str) -> dict[str, Any]:
        files = safetensors_files(weights_dir)
        from brorl.weights.chain import Held

        self._brorl_loaded = Held()  # the model no longer holds the serving state's version
        return self._brorl_reload(iter_safetensors(files), weights_dir)

    def brorl_apply_chain(self, steps: list[dict], run_id: str, careful: bool) -> dict[str, Any]:
        """Apply verified keyframe/delta versions to this worker's serving state
        (brorl.weights.chain.ServingState, kept across calls), then load the result into the
        model when it verified. Returns what the state and the model hold, and the error."""
        from brorl.weights.chain import ChainError, Held, ServingState, Step

        state = getattr(self, "_brorl_state", None)
        if state is None:
            state = self._brorl_state = ServingState()
        start = time.perf_counter()
        error = None
        try:
            state.apply_chain([Step(**s) for s in steps], run_id, careful)
        except ChainError as exc:
            error = {"version": exc.version, "reason": exc.reason}
        applied_s = time.perf_counter() - start
        loaded = getattr(self, "_brorl_loaded", Held())
        stats: dict[str, Any] = {}
        if state.held.version >= 0 and state.held != loaded:
            source = f"serving state v{state.held.version}"
            stats = self._brorl_reload(serving_tensors(state), source, in_place=True)
            self._brorl_loaded = loaded = state.held
        return {
            "held": dataclasses.asdict(state.held),
            "loaded": dataclasses.asdict(loaded),
            "error": error,
            "apply_seconds": applied_s,
            **stats,
        }

    def _brorl_reload(self, tensors, source: str, in_place: bool = False) -> dict[str, Any]:
        """Stream (HF name, tensor) pairs through vLLM's in-place reload, then re-dispatch the
        CPU GEMMs of layers that keep their weight (module docstring). ``in_place``: the
        tensors are a whole state held in memory (the serving state's views), which
        ``_copy_in_place`` may load directly on CPU."""
        import torch
        from vllm.platforms import current_platform

        model = self.model_runner.get_model()
        if in_place and current_platform.is_cpu():
            start = time.perf_counter()
            tensors = dict(tensors)
            with torch.no_grad():
                written = _copy_in_place(model, tensors)
                if written is not None:
                    return {
                        "tensors": len(tensors),
                        "in_place": 1,
                        "cpu_gemm_refreshed": _refresh_cpu_gemm_dispatch(model),
                        "seconds": time.perf_counter() - start,
                    }
            tensors = tensors.items()
        names: list[str] = []

        def counted():
            for name, tensor in tensors:
                names.append(name)
                yield name, tensor

        watch = FailedLayerFilter(tied=lm_head_is_tied(model))
        layer_logger = logging.getLogger(LAYERWISE_LOGGER)
        old_level = layer_logger.level
        if layer_logger.getEffectiveLevel() > logging.WARNING:
            layer_logger.setLevel(logging.WARNING)  # the filter must see the warnings
        layer_logger.addFilter(watch)
        start = time.perf_counter()
        try:
            with torch.no_grad():
                self.model_runner.reload_weights(weights_iterator=counted())
                refreshed = 0
                if current_platform.is_cpu():
                    refreshed = _refresh_cpu_gemm_dispatch(model)
        finally:
            layer_logger.removeFilter(watch)
            layer_logger.setLevel(old_level)
        if watch.unexpected:
            raise RuntimeError(
                f"weights from {source} left layers without weights: {watch.unexpected} "
                f"(tensors read: {len(names)}); the engine now holds a partial reload"
            )
        return {
            "tensors": len(names),
            "in_place": 0,
            "cpu_gemm_refreshed": refreshed,
            "seconds": time.perf_counter() - start,
        }

    def brorl_weight_checksum(self) -> float:
        """Sum of all parameters (a cheap fingerprint for debugging a reload)."""
        import torch

        with torch.no_grad():
            return float(sum(p.double().sum() for p in self.model_runner.get_model().parameters()))
