"""The learner/sampler log-prob gap that a serving dtype adds, on the demo's warm-started model:

    python bench/logp_gap.py --model WARMSTART_DIR [--prompts 16] [--n 64] [--max-tokens 6]

For each serving dtype (bf16, fp32) the sampler is the learner's fp32 weights as that dtype
publishes them (brorl.weights.codec: bf16 rounds to nearest even; fp32 is exact). Paths are
sampled at temperature 1 from the sampler (transformers), and ``logp_gap`` is the mean over
sampled tokens of |log π_learner − log π_sampler| — the learner's ``learner/logp_gap`` at the
version the paths came from, without vLLM's own numerical difference (tests/integration:
≤ 1e-3) or staleness. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# the printed object's documented keys (tests/unit/bench/test_bench_smoke.py checks them)
KEYS = ("bench", "paths", "serving.bf16.logp_gap", "serving.fp32.logp_gap")


def served(model, dtype: str):
    """A copy of ``model`` holding its weights as ``dtype`` publishes them."""
    import copy

    import torch

    from brorl.weights import codec

    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            bits = codec.serving_bits(p.detach().numpy(), dtype)
            p.copy_(torch.from_numpy(codec.bits_to_float32(bits, dtype).copy()))
    return out.eval()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", required=True, help="warm-started demo model directory")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=64, help="paths per prompt")
    ap.add_argument("--max-tokens", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    from demo.evaluate import load_tokenizer
    from demo.task import heldout_problems

    torch.manual_seed(args.seed)
    tok = load_tokenizer(args.model)
    learner = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    problems = heldout_problems(args.prompts)
    result = {"bench": "logp_gap", "paths": args.prompts * args.n, "serving": {}}
    for dtype in ("bf16", "fp32"):
        sampler = served(learner, dtype)
        gaps, tokens, max_gap = 0.0, 0, 0.0
        with torch.no_grad():
            for prob in problems:
                ids = torch.tensor([tok.encode(prob.prompt)] * args.n)  # (n, P)
                alive = torch.ones(args.n, dtype=torch.bool)
                for _ in range(args.max_tokens):
                    lp_s = torch.log_softmax(sampler(ids).logits[:, -1].float(), -1)  # (n, V)
                    lp_l = torch.log_softmax(learner(ids).logits[:, -1].float(), -1)
                    nxt = torch.multinomial(lp_s.exp(), 1)  # (n, 1)
                    diff = (lp_l.gather(1, nxt) - lp_s.gather(1, nxt))[:, 0].abs()
                    gaps += float(diff[alive].sum())
                    tokens += int(alive.sum())
                    if alive.any():
                        max_gap = max(max_gap, float(diff[alive].max()))
                    alive &= nxt[:, 0] != tok.eos_token_id
                    ids = torch.cat([ids, nxt], dim=1)
        result["serving"][dtype] = {
            "logp_gap": gaps / max(tokens, 1),
            "max_abs": max_gap,
            "tokens": tokens,
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
