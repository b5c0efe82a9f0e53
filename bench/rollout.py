"""Rollout throughput: the rollout service (vLLM behind gRPC) generating N paths for one prompt
vs transformers ``generate`` on the same model, prompt and lengths, measured in the same run.

    python bench/rollout.py [--n 512] [--max-tokens 32] [--hidden 128 --layers 4] [--repeats 3]

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
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                                 max_new_tokens=max_tokens, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            times.append(time.perf_counter() - start)
            new = out[:, ids.shape[1]:]
            # tokens up to and including the first EOS (what vLLM also counts)
            produced = 0
            for row in new.tolist():
                produced += (row.index(tok.eos_token_id) + 1) if tok.eos_token_id in row else len(row)
            tokens.append(produced)
    best = min(range(repeats), key=lambda i: times[i])
    return {"seconds": times[best], "tokens": tokens[best], "tokens_per_s": tokens[best] / times[best]}


def service_generate(model_dir: str, prompt: str, n: int, max_tokens: int, repeats: int, tmp: Path) -> dict:
    from brorl.client import RolloutClient
    from brorl.launcher import ServiceProc
    proc = ServiceProc("rollout", tmp, model=model_dir, worker_loop=False,
                       **{"engine.max_model_len": max(64, max_tokens + 32)})
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
    finally:
        proc.stop()
    best = min(range(repeats), key=lambda i: times[i])
    return {"seconds": times[best], "tokens": tokens[best], "tokens_per_s": tokens[best] / times[best]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt", default="123+456=")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from demo.model import create_tiny_model
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = str(create_tiny_model(tmp / "model", hidden_size=args.hidden, layers=args.layers,
                                          heads=max(args.hidden // 64, 2), kv_heads=max(args.hidden // 128, 1),
                                          intermediate_size=3 * args.hidden, max_position=max(64, args.max_tokens + 32)))
        import torch
        from transformers import AutoModelForCausalLM
        params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
        svc = service_generate(model_dir, args.prompt, args.n, args.max_tokens, args.repeats, tmp)
        hf = hf_generate(model_dir, args.prompt, args.n, args.max_tokens, args.repeats)
    print(json.dumps({
        "bench": "rollout", "n": args.n, "max_tokens": args.max_tokens, "params": params,
        "torch_threads": torch.get_num_threads(),
        "rollout_service": svc, "transformers_generate": hf,
        "speedup_service_vs_transformers": svc["tokens_per_s"] / hf["tokens_per_s"],
    }))


if __name__ == "__main__":
    main()
