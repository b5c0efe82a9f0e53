"""The realistic shape of ``bench/e2e.py --shape long``: what a user's run looks like next to
the demo's 6-token prompts, 2-6-token completions and 0.8 M-parameter model.

* the model: a Qwen2 of 24 M parameters (hidden 512, 8 layers, 8 query / 2 key-value heads,
  MLP 1536), random weights, a character tokenizer over letters, digits and punctuation;
* the prompts: one shared instruction (142 characters) then a question, 180 characters and
  about 146 tokens in all (the tokenizer drops spaces) — the shape where vLLM's prefix cache
  and the learner's one prompt pass per group pay;
* the completions: up to ``MAX_TOKENS`` tokens; a random model over 77 characters ends a
  completion (EOS) with a chance of about 1/81 a token, so most run to the cap;
* the learner: its forward under bf16 autocast where the CPU has native bf16, fp32 elsewhere
  (``train.autocast=native``; fp32 master weights);
* the worker: at most a step's paths (128) in one engine call (``rollout.batch_paths``);
* the reward: ``relevance`` (char bigram cosine of prompt and completion), a continuous score on
  which a random model's groups are never all-equal, so every group trains (with the default
  trigrams most paths score 0, and now and then a whole group does: it is dropped, and the step
  waits for another engine call).

What is measured on it is throughput (samples/s, pipeline ratio, the learner's FLOP/s), not
accuracy: nothing here is learnable in a benchmark's minutes.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

INSTRUCTION = (
    "You are given two whole numbers. Add them, check the sum digit by digit from the right, "
    "and answer with the sum alone on one line, then stop. "
)
CHARS = list(string.ascii_letters + string.digits + " .,:;?!+-*/=()'")
MAX_TOKENS = 48
MODEL = {"hidden_size": 512, "layers": 8, "heads": 8, "kv_heads": 2, "intermediate_size": 1536}
# the recipe overrides of the shape (configs/demo.yaml underneath)
OVERRIDES = [
    "reward.functions.relevance.type=relevance",
    "reward.functions.relevance.ngram=2",
    "run.reward_fn=relevance",
    f"run.sampling.max_tokens={MAX_TOKENS}",
    "run.sampling.n=64",
    "run.train.groups_per_step=2",
    "run.train.micro_batch_paths=32",
    # 24 steps: over 8, the first call's fill and the last update (nothing overlaps either)
    # weigh as much as 2 of ~9 steps, and the ratios measure the run's start more than the
    # run (docs/performance.md: pipeline ratio 0.73 over 8 steps and 0.88 over 24 on one VM)
    "run.train.steps=24",
    # the learner's forward in bf16 where its CPU multiplies bf16 natively (AVX512-BF16, AMX):
    # 1.9x fp32 there; emulated elsewhere (an AVX2-only CPU took 336 s a step), so fp32 there
    "run.train.autocast=native",
    # at most a step's paths (2 x 64) an engine call: a 24 M model's decode is compute-bound at
    # 64 sequences, so a call of four groups is no faster per path, and the step's second group
    # would wait for the other two (docs/performance.md)
    "rollout.batch_paths=128",
]


def prompt(a: int, b: int) -> str:
    return f"{INSTRUCTION}Question: what is {a} + {b}? Answer:"


def make_inputs(work: Path, n_prompts: int = 2000, seed: int = 0) -> tuple[Path, Path]:
    """(model directory, JSONL of {"prompt", "reference"}) under ``work``; the model is made once
    (a second call reuses it)."""
    from demo.model import create_tiny_model

    work.mkdir(parents=True, exist_ok=True)
    model = work / "long_shape_model"
    if not (model / "config.json").exists():
        create_tiny_model(model, max_position=512, chars=CHARS, seed=seed, **MODEL)
    rng = random.Random(seed)
    rows = []
    for _ in range(n_prompts):
        a, b = rng.randrange(10, 10_000), rng.randrange(10, 10_000)
        rows.append({"prompt": prompt(a, b), "reference": str(a + b)})
    data = work / "long_shape_train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return model, data
