"""What runs inside vLLM's worker process: ``ReloadExtension``, mixed into vLLM's worker class
(``worker_extension_cls``, named by path in services/rollout/engine.py) and called through
``collective_rpc``.

It reloads weights in place (``model_runner.reload_weights``), keeps the serving state of
published versions across calls (brorl.weights.chain), and after every reload rebuilds the CPU
GEMM dispatch of the layers that keep their weight (``_refresh_cpu_gemm_dispatch``; why: the
engine module's docstring).

A published version of an architecture in ``IN_PLACE_ARCHITECTURES`` on CPU skips vLLM's
layerwise reload (``_prepare_in_place``, ``_swap_in``): that machinery re-creates every layer
on the meta device, wraps each weight loader and counts the elements loaded, about two thirds
of a small model's reload (skipping it: 36 → 16 ms a version for the demo's model,
docs/performance.md). Every tensor is copied into its parameter (packed ones stacked as
``packed_modules_mapping`` says) and each linear layer's GEMM is re-packed as vLLM's own
post-load step does. The copies and the packing are prepared beside a running call
(``brorl_stage_chain``, on the rollout worker's fetch thread); the swap between calls only
installs them. Anything it does not recognise — another architecture, a quantized layer, a
name or shape that does not match — leaves the model untouched and takes the layerwise path.

The driver side (the ``LLM``, sampling, the rollout service's calls) is
services/rollout/engine.py; these two are the only modules that import vllm, one per process.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from types import SimpleNamespace
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


def _prepare_in_place(model, tensors: dict) -> list | None:
    """What loading HF-named ``tensors`` (a whole state) into the model without the layerwise
    reload takes, computed without touching the model: per parameter, its new value and, for a
    linear layer whose weight vLLM packed and dropped, its new GEMM (packed on a stand-in
    layer). None when the model or the tensors are not what this path knows (module
    docstring). ``_swap_in`` then installs it."""
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
    prepared = []  # (module, parameter name, new value or None, packed stand-in or None)
    for module, pname, names, _, repack, _ in plan:
        value = tensors[names[0]] if len(names) == 1 else torch.cat([tensors[n] for n in names])
        param = getattr(module, pname)
        if repack:  # as UnquantizedLinearMethod.process_weights_after_loading does on CPU
            weight = value.to(param.dtype).contiguous()
            stand_in = SimpleNamespace(weight=torch.nn.Parameter(weight, requires_grad=False))
            dispatch_cpu_unquantized_gemm(stand_in, remove_weight=True)
            prepared.append((module, pname, None, stand_in))
        else:  # the parameter's whole new value (padded rows zero), copied in by the swap
            full = torch.zeros_like(param)
            full[: value.shape[0]].copy_(value)
            prepared.append((module, pname, full, None))
    return prepared


def _swap_in(model, prepared: list) -> int:
    """Install what ``_prepare_in_place`` computed; the number of parameters written."""
    for module, pname, full, stand_in in prepared:
        if stand_in is not None:  # the packed GEMM and the dropped weight, as dispatch left them
            module.weight, module.cpu_linear = stand_in.weight, stand_in.cpu_linear
        else:
            getattr(module, pname).copy_(full)
    return len(prepared)


class ReloadExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); runs in the worker process."""

    def brorl_reload_weights(self, weights_dir: str) -> dict[str, Any]:
        files = safetensors_files(weights_dir)
        from brorl.weights.chain import Held

        self._brorl_loaded = Held()  # the model no longer holds the serving state's version
        self._brorl_staged = None  # nor will it: a directory's weights replace what was staged
        return self._brorl_reload(iter_safetensors(files), weights_dir)

    def brorl_self(self):
        """This worker: an in-process engine stages versions on it directly, from a thread that
        runs beside the engine's calls (services/rollout/engine.py ``stage_weight_chain``)."""
        return self

    def brorl_apply_chain(self, steps: list[dict], run_id: str, careful: bool) -> dict[str, Any]:
        """``brorl_stage_chain`` then ``brorl_swap_staged``: the versions applied and the model
        serving the result, in one call."""
        out = self.brorl_stage_chain(steps, run_id, careful)
        return {**out, **self.brorl_swap_staged()}

    def brorl_stage_chain(self, steps: list[dict], run_id: str, careful: bool) -> dict[str, Any]:
        """Apply verified keyframe/delta versions to this worker's serving state
        (brorl.weights.chain.ServingState, kept across calls) and, when the result verified and
        the model does not hold it, prepare the model's next weights without touching the model
        (``_prepare_in_place``; ``brorl_swap_staged`` installs them). Safe beside a running
        engine call: nothing here is read by the model. Returns what the state holds, what the
        swap will load (``staged``), and the error."""
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
        staged = getattr(self, "_brorl_loaded", Held())
        self._brorl_staged = None
        if state.held.version >= 0 and state.held != staged:
            staged = state.held
            self._brorl_staged = (staged, self._brorl_prepare(serving_tensors(state)))
        return {
            "held": dataclasses.asdict(state.held),
            "staged": dataclasses.asdict(staged),
            "error": error,
            "apply_seconds": applied_s,
            "prepare_seconds": time.perf_counter() - start - applied_s,
        }

    def brorl_swap_staged(self) -> dict[str, Any]:
        """Serve what ``brorl_stage_chain`` staged (between engine calls): the prepared weights
        swapped in, or, where none could be prepared, the serving state reloaded. Returns what
        the model holds now."""
        from brorl.weights.chain import Held

        staged, self._brorl_staged = getattr(self, "_brorl_staged", None), None
        stats: dict[str, Any] = {}
        if staged is not None:
            held, prepared = staged
            source = f"serving state v{held.version}"
            stats = self._brorl_reload(serving_tensors(self._brorl_state), source, prepared)
            self._brorl_loaded = held
        return {"loaded": dataclasses.asdict(getattr(self, "_brorl_loaded", Held())), **stats}

    def _brorl_prepare(self, tensors) -> list | None:
        """The in-place load of a whole state, prepared (CPU only; None: the layerwise reload)."""
        import torch
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return None
        with torch.no_grad():
            return _prepare_in_place(self.model_runner.get_model(), dict(tensors))

    def _brorl_reload(self, tensors, source: str, prepared: list | None = None) -> dict[str, Any]:
        """Install ``prepared`` (``_prepare_in_place``) or, without it, stream the (HF name,
        tensor) pairs through vLLM's in-place reload; then re-dispatch the CPU GEMMs of layers
        that keep their weight (module docstring)."""
        import torch
        from vllm.platforms import current_platform

        model = self.model_runner.get_model()
        if prepared is not None:
            start = time.perf_counter()
            with torch.no_grad():
                written = _swap_in(model, prepared)
                return {
                    "tensors": written,
                    "in_place": 1,
                    "cpu_gemm_refreshed": _refresh_cpu_gemm_dispatch(model),
                    "seconds": time.perf_counter() - start,
                }
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
