"""The Countdown warm-start: supervised learning on a demonstrator that is right only part of
the time (demo/countdown/task.py ``Demonstrator``, a rate per difficulty label), cached by config
hash, then measured on held-out problems: greedy pass@1 overall and per label, and sampled
pass@k (temperature 1) of the hard label. docs/countdown.md has the recipe and its numbers.

Loss is next-token cross-entropy on the answer's tokens and the closing ``<eos>`` only; the
prompt (``3,7,25,50:78=``) is context. Every step draws fresh demonstrator answers. Correctness
is the ``countdown`` reward's own checker (services/reward/functions/countdown.py ``check``).

``warmstart(out, cfg)`` trains once per configuration: a later call with the same configuration
finds ``countdown.json`` (config hash + measurements) in ``out`` and returns it at once.

    python -m demo.countdown.warmstart --out DIR [--steps N] [--hard 0.0] ...   (one JSON line)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from demo.countdown.task import CHARS, LABELS, Demonstrator, Problem, heldout, problems
from demo.passk import pass_at_k
from demo.warmstart import settings_hash, strict_config

MARKER = "countdown.json"
FORMAT_VERSION = 1  # bump when the procedure changes in a way the config misses
MAX_NEW_TOKENS = 24  # the longest demonstrator answer is 15 characters
SPEED_ONLY = ("threads", "sample_batch")  # settings that change speed, not results


@dataclass(frozen=True)
class CountdownWarmstartConfig:
    # --- data (demo/countdown/task.py; train problems never share numbers with held-out) ---
    train_problems: int = 20_000
    data_seed: int = 1
    # --- the demonstrator: the rate at which it writes a solution, per label ---
    easy: float = 0.3
    medium: float = 0.5  # hardly matters: 0.3 and 0.7 measure the same (docs/countdown.md)
    hard: float = 0.5
    reuse: float = 0.25  # a wrong answer reuses a number (else a near miss)
    near: int = 4  # a near miss is the closest of this many random expressions
    # --- model (demo.model.create_tiny_model) ---
    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 384
    max_position: int = 64
    # --- optimisation (AdamW; linear warm-up, cosine decay to a tenth) ---
    steps: int = 800
    batch_size: int = 64
    lr: float = 1.5e-3
    warmup_steps: int = 50
    seed: int = 0  # model init, batch order and the demonstrator's draws
    # --- measurement ---
    eval_problems: int = 1000  # held-out problems for greedy pass@1
    passk_problems: int = 20  # hard held-out problems sampled for pass@k (0: none)
    passk_samples: int = 512  # completions per problem (temperature 1)
    sample_seed: int = 0
    # --- speed only (not in the hash) ---
    threads: int = 1  # torch threads: a tiny model on a shared machine
    sample_batch: int = 512  # sequences per generate call when sampling

    def hash(self) -> str:
        return settings_hash(self, FORMAT_VERSION, SPEED_ONLY)

    @classmethod
    def from_dict(cls, d: dict) -> "CountdownWarmstartConfig":
        return strict_config(cls, d, "Countdown warm-start")

    def demonstrator(self) -> Demonstrator:
        rates = tuple((label, getattr(self, label)) for label in LABELS)
        return Demonstrator(correct=self.easy, by_label=rates, reuse=self.reuse, near=self.near)


def read_marker(out: str | Path) -> dict | None:
    try:
        return json.loads((Path(out) / MARKER).read_text())
    except (OSError, ValueError):
        return None


def is_cached(out: str | Path, cfg: CountdownWarmstartConfig) -> bool:
    meta = read_marker(out)
    return meta is not None and meta.get("config_hash") == cfg.hash()


def is_correct(completion: str, p: Problem) -> bool:
    """The ``countdown`` reward's verdict on ``completion`` (its own checker)."""
    from services.reward.functions.countdown import Verdict, check

    return check(completion, p.numbers, p.target)[0] == Verdict.CORRECT


def encode(tokenizer, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    """(ids, labels) of prompt + answer + <eos>; ``labels[t]`` is the target of the prediction
    made at position ``t`` (already shifted), -100 wherever the next token is the prompt's."""
    head = tokenizer.encode(prompt)
    ids = head + tokenizer.encode(answer) + [tokenizer.eos_token_id]
    labels = [-100] * (len(head) - 1) + ids[len(head) :] + [-100]
    return ids, labels


def padded(rows: list[tuple[list[int], list[int]]], pad: int):
    """Right-padded (ids, labels) tensors, (B, T) each; padding is -100 in the labels."""
    import torch

    width = max(len(ids) for ids, _ in rows)
    x = torch.full((len(rows), width), pad, dtype=torch.long)  # (B, T)
    y = torch.full((len(rows), width), -100, dtype=torch.long)  # (B, T)
    for r, (ids, labels) in enumerate(rows):
        x[r, : len(ids)], y[r, : len(labels)] = torch.tensor(ids), torch.tensor(labels)
    return x, y


def answer_loss(model, x, y, pad: int):
    """Mean next-token cross-entropy over the positions whose label is not -100."""
    import torch.nn.functional as F

    logits = model(input_ids=x, attention_mask=(x != pad).long()).logits  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100)


def lr_at(step: int, cfg: CountdownWarmstartConfig) -> float:
    warm = min(1.0, (step + 1) / max(1, cfg.warmup_steps))
    cosine = 0.5 * (1 + math.cos(math.pi * step / max(1, cfg.steps - 1)))
    return cfg.lr * warm * (0.1 + 0.9 * cosine)


def train(model, tokenizer, cfg: CountdownWarmstartConfig) -> float:
    """``cfg.steps`` AdamW steps on fresh demonstrator answers; returns the last loss (EMA)."""
    import torch

    data = problems(cfg.train_problems, "train", cfg.data_seed)
    teacher, rng = cfg.demonstrator(), random.Random(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.01)
    pad, ema = tokenizer.pad_token_id, None
    model.train()
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        idx = torch.randint(0, len(data), (cfg.batch_size,), generator=gen).tolist()
        batch = [data[i] for i in idx]
        x, y = padded([encode(tokenizer, p.prompt, teacher.answer(p, rng)) for p in batch], pad)
        loss = answer_loss(model, x, y, pad)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
    model.eval()
    return ema


def greedy_pass(model, tokenizer, held: list[Problem]) -> dict:
    """Greedy pass@1 overall and per label, with the count of problems of each and, per label,
    the share of each of the checker's verdicts (``verdicts``: what the wrong answers get
    wrong; the commonest first)."""
    from demo.evaluate import greedy_completions

    texts = greedy_completions(
        model, tokenizer, [p.prompt for p in held], max_new_tokens=MAX_NEW_TOKENS
    )
    return tally(texts, held)


def tally(texts: list[str], held: list[Problem]) -> dict:
    """``greedy_pass``'s measurements of one completion per problem."""
    from services.reward.functions.countdown import Verdict, check

    verdicts = [check(t, p.numbers, p.target)[0] for t, p in zip(texts, held, strict=True)]
    hits = [v == Verdict.CORRECT for v in verdicts]
    out = {"overall": sum(hits) / len(held), "n": len(held), "by_label": {}, "n_by_label": {}}
    out["verdicts"] = {}
    for label in LABELS:
        mine = [v for v, p in zip(verdicts, held) if p.label == label]
        out["by_label"][label] = mine.count(Verdict.CORRECT) / len(mine) if mine else None
        out["n_by_label"][label] = len(mine)
        counts = sorted(Counter(mine).items(), key=lambda kv: (-kv[1], kv[0]))
        out["verdicts"][label] = {v: c / len(mine) for v, c in counts}
    return out


def sample_counts(model, tokenizer, held: list[Problem], samples: int, seed: int, batch: int):
    """How many of ``samples`` completions (temperature 1, no top-k/top-p) of each problem the
    reward's checker accepts; generation in chunks of at most ``batch`` sequences."""
    import torch

    torch.manual_seed(seed)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    counts = []
    for p in held:
        ids = torch.tensor([tokenizer.encode(p.prompt)])  # (1, T)
        hits, left = 0, samples
        while left:
            n = min(left, batch)
            left -= n
            with torch.no_grad():
                out = model.generate(
                    input_ids=ids.expand(n, -1),
                    attention_mask=torch.ones(n, ids.shape[1], dtype=torch.long),
                    do_sample=True,
                    temperature=1.0,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=MAX_NEW_TOKENS,
                    eos_token_id=eos,
                    pad_token_id=pad,
                )[:, ids.shape[1] :]  # (n, new)
            for row in out.tolist():
                hits += eos in row and is_correct(tokenizer.decode(row[: row.index(eos)]), p)
        counts.append(hits)
    return counts


def pass_at_ks(counts: list[int], samples: int) -> dict[str, float]:
    """Unbiased pass@k (demo.passk.pass_at_k) averaged over problems, k = 1, 2, 4, ... samples."""
    if not counts:
        return {}
    ks = sorted({2**i for i in range(samples.bit_length()) if 2**i <= samples} | {samples})
    return {str(k): sum(pass_at_k(samples, c, k) for c in counts) / len(counts) for k in ks}


def hard_passk(model, tokenizer, cfg: CountdownWarmstartConfig, label: str = "hard") -> dict:
    """Sampled pass@k of the first ``passk_problems`` held-out problems of ``label`` (drawn
    from held-out prefixes of growing length until there are enough)."""
    size = max(1, cfg.eval_problems)
    while True:
        chosen = [p for p in heldout(size) if p.label == label][: cfg.passk_problems]
        if len(chosen) == cfg.passk_problems or size >= 100_000:
            break
        size *= 2
    start = time.perf_counter()
    counts = sample_counts(
        model, tokenizer, chosen, cfg.passk_samples, cfg.sample_seed, cfg.sample_batch
    )
    return {
        "label": label,
        "n": len(chosen),
        "samples": cfg.passk_samples,
        "pass_at_k": pass_at_ks(counts, cfg.passk_samples),
        "correct_per_problem": counts,
        "seconds": round(time.perf_counter() - start, 1),
    }


def measure(model_dir: str | Path, cfg: CountdownWarmstartConfig, label: str) -> dict:
    """Sampled pass@k of a trained model directory (no training; nothing written)."""
    import torch

    from demo.evaluate import load_model

    torch.set_num_threads(cfg.threads)
    model, tokenizer = load_model(model_dir)
    return hard_passk(model, tokenizer, cfg, label)


def warmstart(out: str | Path, cfg: CountdownWarmstartConfig | None = None) -> dict:
    """Train (or find cached) the Countdown warm-start in ``out``; returns its marker."""
    cfg, out = cfg or CountdownWarmstartConfig(), Path(out)
    if is_cached(out, cfg):
        return read_marker(out)
    import torch

    from demo import model as model_factory
    from demo.evaluate import load_model

    torch.set_num_threads(cfg.threads)
    start = time.perf_counter()
    (out / MARKER).unlink(missing_ok=True)  # being rewritten: no stale claim survives a crash
    shape = {k: getattr(cfg, k) for k in ("hidden_size", "layers", "heads", "kv_heads")}
    model_factory.create_tiny_model(
        out, **shape, intermediate_size=cfg.intermediate_size, max_position=cfg.max_position,
        seed=cfg.seed, chars=CHARS,
    )  # fmt: skip
    model, tokenizer = load_model(out)
    final_loss = train(model, tokenizer, cfg)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    train_seconds = time.perf_counter() - start
    meta = {
        "config_hash": cfg.hash(),
        "config": asdict(cfg),
        "params": sum(p.numel() for p in model.parameters()),
        "train_seconds": round(train_seconds, 1),
        "final_loss": final_loss,
        "greedy_pass_at_1": greedy_pass(model, tokenizer, heldout(cfg.eval_problems)),
        "hard_sampled": hard_passk(model, tokenizer, cfg) if cfg.passk_problems else None,
        "total_seconds": None,
    }
    meta["total_seconds"] = round(time.perf_counter() - start, 1)
    tmp = out / (MARKER + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1) + "\n")
    tmp.replace(out / MARKER)
    return meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="The Countdown warm-start (one JSON line).")
    ap.add_argument("--out", required=True, help="model directory (cached by config hash)")
    ap.add_argument(
        "--measure", choices=LABELS, help="only sample pass@k of this label from --out's model"
    )
    for f in fields(CountdownWarmstartConfig):
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    args = vars(ap.parse_args(argv))
    out, label = args.pop("out"), args.pop("measure")
    cfg = CountdownWarmstartConfig(**args)
    meta = measure(out, cfg, label) if label else warmstart(out, cfg)
    print(json.dumps(meta), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
