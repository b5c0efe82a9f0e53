"""Delta weight publication, measured on a >= 20 M-parameter Qwen2 (hidden 512, 8 layers):

* per learning rate (1e-6, 1e-5, 2e-4): a few real AdamW steps on random tokens, each version
  published by the learner's WeightPublisher (bf16 serving): bytes on disk of the keyframe and
  of every delta, and the fraction of elements whose bf16 bits changed;
* latency: publish -> a rollout worker (WeightSync + the real vLLM engine) has applied the
  version and serves it, divided by a plain safetensors write + read of the same full bf16
  bytes (torch ``save_file`` + ``load_file``) on this machine; and ``floor_ratio``: the
  rounding and the two sha256 passes the design requires, alone, in the same unit.

    python bench/weights.py [--steps 5] [--latency-steps 3] [--latency-only] [--no-engine] [--tiny]

Prints one JSON object. ``--no-engine`` measures the worker side with an in-process serving
state instead of vLLM (no reload into a model). ``--tiny``: the demo's 0.8 M-parameter model
instead (the smoke test's size: every path runs, the figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = dict(hidden_size=512, layers=8, heads=8, kv_heads=4, intermediate_size=1536)
LRS = (1e-6, 1e-5, 2e-4)
# the printed object's documented keys (tests/unit/bench/test_bench_smoke.py checks them)
KEYS = ("bench", "params", "lr", "latency.latency_ratio", "latency.floor_ratio", "targets")


def adam_steps(model_dir: str, lr: float, seed: int = 0):
    """The model, its AdamW optimizer and a function taking one step on random tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    vocab = model.config.vocab_size

    def step():
        x = torch.randint(0, vocab, (4, 32))
        model(x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()

    return model, step


def weights_of(model):
    """As services.learner.model.policy.Policy.weights: HF names, tied tensors once, fp32 numpy."""
    out, seen = {}, set()
    for name, t in model.state_dict().items():
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            out[name] = t.detach().numpy()
    return out


def sizes_run(model_dir: str, lr: float, steps: int, root: Path) -> dict:
    from brorl.weights.store import WeightStore
    from services.learner.publish import WeightPublisher

    model, step = adam_steps(model_dir, lr)
    publisher = WeightPublisher(WeightStore(root), "bf16", keyframe_every=1000)
    pointers, seconds = [], []
    for v in range(steps + 1):
        if v:
            step()
        start = time.perf_counter()
        publisher.publish(lambda: weights_of(model), pointers.append, v, step=v)
        seconds.append(time.perf_counter() - start)
    full = pointers[0].bytes
    elements = publisher.last.bits and sum(b.size for b in publisher.last.bits.values())
    versions = []
    for p in pointers[1:]:
        serving = json.loads((Path(p.uri) / "manifest.json").read_text())["serving"]
        versions.append(
            {
                "version": p.version,
                "delta_bytes": p.bytes,
                "delta_over_full": p.bytes / full,
                "changed_density": serving["changed"] / serving["elements"],
            }
        )
    return {
        "full_bytes": full,
        "elements": elements,
        "versions": versions,
        "delta_over_full_max": max(v["delta_over_full"] for v in versions),
        "delta_over_full_last": versions[-1]["delta_over_full"],
        "publish_s_median": statistics.median(seconds[1:]),
    }


def plain_write_read_s(model, tmp: Path, repeats: int = 3) -> list[float]:
    """A few safetensors write + read of the full bf16 state (the latency's unit)."""
    import torch
    from safetensors.torch import load_file, save_file

    state = {n: torch.from_numpy(a).to(torch.bfloat16) for n, a in weights_of(model).items()}
    times = []
    for i in range(repeats):
        path = tmp / f"plain{i}.safetensors"
        start = time.perf_counter()
        save_file(state, str(path))
        loaded = load_file(str(path))
        _ = [t.sum() for t in loaded.values()]  # touch every byte (load_file maps lazily)
        times.append(time.perf_counter() - start)
        path.unlink()
    return times


def floor_s(model, repeats: int = 5) -> dict:
    """The per-byte work the design cannot skip, timed on the whole bf16 state (best of
    ``repeats``): rounding the fp32 master, one sha256 pass (one thread: the vLLM worker process
    is pinned to one core; and on the codec's threads: the learner), as the learner runs them."""
    from brorl.weights import codec

    master = weights_of(model)

    def best(fn) -> float:
        return min(timeit.repeat(fn, number=1, repeat=repeats))

    bits = {n: codec.serving_bits(a, "bf16") for n, a in master.items()}
    return {
        "round_bf16_threaded_s": best(
            lambda: codec.parallel_map(lambda a: codec.serving_bits(a, "bf16"), master.values())
        ),
        "sha256_one_thread_s": best(lambda: [codec.tensor_sha256(b) for b in bits.values()]),
        "sha256_threaded_s": best(lambda: codec.tensor_hashes(bits)),
        "threads": codec.THREADS,
    }


def old_full_path_s(model, engine, tmp: Path, version: int) -> float:
    """The path this replaced: save_pretrained (fp32) + store commit + verify + reload."""
    from brorl.weights.store import WeightStore

    store = WeightStore(tmp / "old")
    start = time.perf_counter()
    staging = store.staging_dir(version)
    model.save_pretrained(staging, safe_serialization=True)
    pointer = store.commit(version, staging)
    engine.load_weights(str(WeightStore.verify(pointer)), version)
    engine.generate([[1, 2, 3]], n=1, temperature=0.0, max_tokens=1)
    return time.perf_counter() - start


def latency_run(model_dir: str, steps: int, tmp: Path, use_engine: bool) -> dict:
    from brorl.weights.store import WeightStore
    from services.learner.publish import WeightPublisher
    from services.rollout.weight_sync import WeightSync
    from tests.unit.services.rollout.test_weight_sync import StateEngine

    model, step = adam_steps(model_dir, 1e-6)
    engine = None
    if use_engine:
        from services.rollout.engine import RolloutEngine

        engine = RolloutEngine(model_dir, max_model_len=64, max_num_seqs=16)
    target = engine or StateEngine()
    sync = WeightSync(target, threading.Lock(), deadline_s=120)
    publisher = WeightPublisher(WeightStore(tmp / "latency"), "bf16", keyframe_every=1000)
    pointers, rows = [], []
    try:
        for v in range(steps + 1):
            if v:
                step()
            start = time.perf_counter()
            publisher.publish(lambda: weights_of(model), pointers.append, v, step=v)
            published = time.perf_counter()
            assert sync.sync("bench", pointers[-1]) and target.weight_version == v
            if engine is not None:
                engine.generate([[1, 2, 3]], n=1, temperature=0.0, max_tokens=1)  # it serves
            done = time.perf_counter()
            rows.append(
                {
                    "version": v,
                    "kind": pointers[-1].kind,
                    "publish_s": published - start,
                    "worker_s": done - published,
                    "total_s": done - start,
                    **({"engine": dict(engine.last_apply)} if engine is not None else {}),
                }
            )
        plain = plain_write_read_s(model, tmp, repeats=5)
        floor = floor_s(model)
        old = [old_full_path_s(model, engine, tmp, 100 + i) for i in range(3)] if engine else []
    finally:
        if engine is not None:
            engine.close()
    deltas = [r["total_s"] for r in rows if r["kind"] == "delta"]
    return {
        "through": "vllm engine" if engine is not None else "in-process serving state",
        "plain_safetensors_write_read_s": plain,
        "delta_publish_to_serving_s": deltas,
        # the same statistic on both sides; the machine is shared, so the best run is the
        # least disturbed one
        "latency_ratio": min(deltas) / min(plain),
        "latency_ratio_median": statistics.median(deltas) / statistics.median(plain),
        "old_full_fp32_publish_to_serving_s": old,
        # what the checks alone cost, in units of the plain write + read: the learner rounds and
        # hashes (threaded), the engine hashes again (one core) before the model is loaded
        "floor": floor,
        "floor_ratio": (
            floor["round_bf16_threaded_s"]
            + floor["sha256_threaded_s"]
            + floor["sha256_one_thread_s"]
        )
        / min(plain),
        "keyframe_publish_to_serving_s": rows[0]["total_s"],
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=5, help="Adam steps (versions) per lr")
    ap.add_argument("--latency-steps", type=int, default=3)
    ap.add_argument("--no-engine", action="store_true")
    ap.add_argument("--latency-only", action="store_true", help="skip the per-lr size runs")
    ap.add_argument("--tiny", action="store_true", help="the demo's tiny model (a smoke run)")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from transformers import AutoModelForCausalLM

    from demo.model import create_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = str(create_tiny_model(tmp / "model", **({} if args.tiny else MODEL)))
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        params = sum(p.numel() for p in model.parameters())
        result = {"bench": "weights", "params": params, "serving_dtype": "bf16", "lr": {}}
        for lr in () if args.latency_only else LRS:
            result["lr"][f"{lr:g}"] = sizes_run(model_dir, lr, args.steps, tmp / f"lr{lr:g}")
        result["latency"] = latency_run(model_dir, args.latency_steps, tmp, not args.no_engine)
    low = result["lr"].get(f"{LRS[0]:g}", {"delta_over_full_max": float("nan")})
    result["targets"] = {
        "delta_over_full_at_lr_1e-6_max": low["delta_over_full_max"],
        "delta_ok": low["delta_over_full_max"] <= 0.05,
        "latency_ratio": result["latency"]["latency_ratio"],
        "latency_ok": result["latency"]["latency_ratio"] <= 2.0,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
