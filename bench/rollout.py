"""Rollout throughput, measured in one run on one machine:

* the rollout service (vLLM behind gRPC) generating N=512 paths for one prompt vs transformers
  ``generate`` on the same model, prompt and lengths;
* samples/s of one N=512 request vs 32 requests of N=16 (same total samples, same model);
* the achieved fraction of a compute roofline: peak fp32 GEMM FLOP/s measured here, divided by
  2·parameters FLOPs per generated token, for a model of >= 20 M parameters.

    python bench/rollout.py [--n 512] [--max-tokens 32] [--repeats 2] [--models tiny,24m]
                            [--roofline-sizes 1024,2048,3072]

Prints one JSON object. Tokens are counted as produced (paths may stop at EOS early in both).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.peak import peak_gemm_flops  # noqa: E402

ROOFLINE_SIZES = "1024,2048,3072"  # the best of a few sizes is the roofline's peak
# the printed object's documented keys (tests/unit/bench/test_bench_smoke.py checks them)
KEYS = ("bench", "n", "max_tokens", "models", "peak_gemm_flops")
MODELS = {  # name: create_tiny_model kwargs
    "tiny": dict(hidden_size=128, layers=4, heads=4, kv_heads=2, intermediate_size=384),
    "24m": dict(hidden_size=512, layers=8, heads=8, kv_heads=4, intermediate_size=1536),
}


def best(times: list[float], counts: list[int], samples: int) -> dict:
    i = min(range(len(times)), key=lambda j: times[j])
    return {
        "seconds": times[i],
        "tokens": counts[i],
        "tokens_per_s": counts[i] / times[i],
        "samples_per_s": samples / times[i],
    }


def hf_generate(model_dir: str, prompt: str, n: int, max_tokens: int, repeats: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = tok(prompt, return_tensors="pt").input_ids.repeat(n, 1)
    times, tokens = [], []
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                max_new_tokens=max_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
            times.append(time.perf_counter() - start)
            rows = out[:, ids.shape[1] :].tolist()
            # tokens up to and including the first EOS (what vLLM also counts)
            tokens.append(
                sum(
                    (r.index(tok.eos_token_id) + 1) if tok.eos_token_id in r else len(r)
                    for r in rows
                )
            )
    return best(times, tokens, n)


def service_runs(
    model_dir: str, prompt: str, n: int, max_tokens: int, repeats: int, tmp: Path
) -> dict:
    from brorl.client import RolloutClient
    from brorl.apps.cluster.service_proc import ServiceProc

    proc = ServiceProc(
        "rollout",
        tmp,
        name=Path(model_dir).name,
        model=model_dir,
        worker_loop=False,
        **{"engine.max_model_len": max(64, max_tokens + 32)},
    )
    out = {}
    try:
        proc.wait_serving(timeout=300)
        client = RolloutClient(proc.address)
        client.generate(prompt, n=n, temperature=1.0, max_tokens=max_tokens)  # warm-up
        times, tokens = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            resp = client.generate(prompt, n=n, temperature=1.0, max_tokens=max_tokens)
            times.append(time.perf_counter() - start)
            tokens.append(sum(len(p.token_ids) for p in resp.paths))
        out["one_request"] = best(times, tokens, n)
        small = 16
        times, tokens = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            count = 0
            for _ in range(n // small):
                resp = client.generate(prompt, n=small, temperature=1.0, max_tokens=max_tokens)
                count += sum(len(p.token_ids) for p in resp.paths)
            times.append(time.perf_counter() - start)
            tokens.append(count)
        out[f"{n // small}_requests_of_{small}"] = best(times, tokens, n)
    finally:
        proc.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prompt", default="123+456=")
    ap.add_argument("--models", default="tiny,24m", help=f"comma list of {sorted(MODELS)}")
    ap.add_argument(
        "--roofline-sizes", default=ROOFLINE_SIZES, help="square GEMM sizes of the peak FLOP/s"
    )
    args = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import torch
    from transformers import AutoModelForCausalLM

    from demo.model import create_tiny_model

    sizes = [int(size) for size in args.roofline_sizes.split(",")]
    peak_before = peak_gemm_flops(sizes=sizes, repeats=8)
    result = {
        "bench": "rollout",
        "n": args.n,
        "max_tokens": args.max_tokens,
        "torch_threads": torch.get_num_threads(),
        "models": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name in args.models.split(","):
            model_dir = str(
                create_tiny_model(
                    tmp / name, max_position=max(64, args.max_tokens + 32), **MODELS[name]
                )
            )
            params = sum(
                p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters()
            )
            svc = service_runs(model_dir, args.prompt, args.n, args.max_tokens, args.repeats, tmp)
            hf = hf_generate(model_dir, args.prompt, args.n, args.max_tokens, args.repeats)
            one = svc["one_request"]
            result["models"][name] = {
                "params": params,
                "rollout_service": svc,
                "transformers_generate": hf,
                "speedup_service_vs_transformers": one["tokens_per_s"] / hf["tokens_per_s"],
                "samples_per_s_ratio_one_512_vs_32x16": one["samples_per_s"]
                / svc[f"{args.n // 16}_requests_of_16"]["samples_per_s"],
                # decode FLOPs per token ~ 2 * parameters
                # (attention over <= 64 positions is negligible)
                "_flops": one["tokens_per_s"] * 2 * params,
            }
    # measured before and after the generation runs; the larger is the roofline's peak
    peak_after = peak_gemm_flops(sizes=sizes, repeats=8)
    result["peak_gemm_flops"] = peak = max(peak_before, peak_after)
    for r in result["models"].values():
        r["roofline_fraction"] = r.pop("_flops") / peak
    print(json.dumps(result))


if __name__ == "__main__":
    main()
