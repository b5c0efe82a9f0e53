"""Evaluate several model directories (e.g. published weight versions) in one process:

    python -m demo.eval_many --tokenizer WARMSTART_DIR --n 200 DIR [DIR ...]

prints one JSON object per directory: {"model": DIR, "accuracy": ...}. A weight-store version
(a keyframe or a delta, docs/weights.md) is rebuilt from its chain and loaded into the model of
--tokenizer's directory (the warm-start model: its config and tokenizer).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load_model(path: str, base_dir: str):
    """A Hugging Face directory as it is; a weight-store version as base_dir's model holding the
    version's serving weights (bf16 values become their exact fp32 values)."""
    import torch
    from transformers import AutoModelForCausalLM

    if not (Path(path) / "manifest.json").is_file():
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    from brorl.weights import codec
    from brorl.weights.chain import reconstruct

    state = reconstruct(Path(path))
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    tensors = {
        n: torch.from_numpy(codec.bits_to_float32(b, state.dtype).copy())
        for n, b in state.tensors.items()
    }
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ValueError(f"{path}: tensors do not match the model ({unexpected or missing})")
    if "lm_head.weight" in missing:
        model.tie_weights()
    return model.eval()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--tokenizer", required=True, help="directory with the tokenizer (the warm-start model)"
    )
    ap.add_argument("--n", type=int, default=200, help="held-out problems")
    ap.add_argument("models", nargs="+")
    args = ap.parse_args(argv)
    from demo.evaluate import evaluate, load_tokenizer
    from demo.task import heldout_problems
    from demo.warmstart import WarmstartConfig, read_marker, task_kwargs

    meta = read_marker(args.tokenizer)
    base = WarmstartConfig.from_dict(meta["config"]) if meta else WarmstartConfig()
    problems = heldout_problems(args.n, **task_kwargs(base))
    tok = load_tokenizer(args.tokenizer)
    for path in args.models:
        model = load_model(path, args.tokenizer)
        result = evaluate(model, problems, tokenizer=tok)
        print(json.dumps({"model": path, "accuracy": result.accuracy, "n": result.n}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
