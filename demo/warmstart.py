"""Supervised warm-start of the demo model on the arithmetic task (cached by config hash).

The warm-start is deliberately partial, in a way that RL with an exact-match reward can
repair within a few dozen steps. The default recipe (the ``WarmstartConfig`` defaults):
0.79 M-parameter Qwen2 (hidden 128, 4 layers), 1-2 digit addition, 1500 AdamW steps of
64 examples, taught by a demonstrator that writes 70% of its answers zero-padded to three
characters (``"098"`` for 98). The model learns to add, but its greedy answer is padded
whenever the sum is below 100, so exact match holds only for three-digit sums: about 18%
held-out accuracy, while about 75% of its answers are the right number. Sampling at
temperature 1 produces the unpadded form ~30% of the time, so an exact-match reward
separates the two forms within every group of paths and RL removes the padding.

``warmstart`` trains once per configuration; a later call with the same configuration
finds ``warmstart.json`` (config hash + measured accuracy) in ``out_dir`` and returns at
once. Results are deterministic given the config and the torch thread count.

Loss is next-token cross-entropy on the answer tokens and the closing ``<eos>`` only; the
prompt is context. Train problems exclude the first ``exclude_heldout`` held-out prompts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from demo.task import (
    Problem,
    answer_width,
    count_distinct,
    heldout_problems,
    problems,
    teacher_answer,
)

log = logging.getLogger(__name__)

MARKER = "warmstart.json"
FORMAT_VERSION = 2  # bump when the training procedure changes in a way the config misses


@dataclass(frozen=True)
class WarmstartConfig:
    """The defaults are the demo recipe (see the module docstring)."""

    # --- task (demo.task) ---
    max_digits: int = 2  # operands have up to max_digits digits
    min_digits: int = 1  # 1: small operands common; >1: exact widths
    ops: str = "+"  # operators drawn uniformly
    exclude_heldout: int = 1000  # held-out prompts (fixed seed) never used for training
    train_problems: int = 20_000  # size of the training pool (capped by the task's size)
    data_seed: int = 1
    # --- the demonstrator's deliberate flaws (demo.task.teacher_answer) ---
    zero_pad: float = 0.7  # answers zero-padded ("098") with this probability
    carry_drop: float = 0.0  # each carry forgotten with this probability
    final_carry_drop: float = 0.0  # the final carry (leading 1) forgotten with this prob.
    # --- model (demo.model.create_tiny_model) ---
    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 384
    max_position: int = 64
    model_seed: int = 0
    # --- optimisation (AdamW, linear warm-up, cosine decay) ---
    steps: int = 1500
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1  # cosine decay to lr * min_lr_ratio
    weight_decay: float = 0.01
    seed: int = 0  # batch order and the demonstrator's draws
    # --- measurement ---
    eval_problems: int = 500  # held-out problems used for the recorded accuracy

    def hash(self) -> str:
        return settings_hash(self, FORMAT_VERSION)

    @classmethod
    def from_dict(cls, d: dict) -> "WarmstartConfig":
        return strict_config(cls, d, "warm-start")


def settings_hash(cfg, version: int, speed_only: tuple[str, ...] = ()) -> str:
    """A warm-start configuration's cache key (every demo warm-start's): its settings but the
    ones that change only its speed, and the procedure's format ``version``."""
    settings = {k: v for k, v in asdict(cfg).items() if k not in speed_only}
    blob = json.dumps({"v": version, **settings}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def strict_config(cls, d: dict, what: str):
    """``cls(**d)``, refusing a setting ``cls`` does not have (named, with ``what`` it is)."""
    unknown = set(d) - {f.name for f in fields(cls)}
    if unknown:
        raise ValueError(f"unknown {what} settings: {sorted(unknown)}")
    return cls(**d)


def read_marker(out_dir: str | Path) -> dict | None:
    """The recorded warm-start metadata of ``out_dir``, or None if there is none."""
    path = Path(out_dir) / MARKER
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def is_cached(out_dir: str | Path, config: WarmstartConfig) -> bool:
    meta = read_marker(out_dir)
    return (
        meta is not None
        and meta.get("config_hash") == config.hash()
        and (Path(out_dir) / "config.json").exists()
    )


def encode_examples(tokenizer, items: list[Problem]):
    """Right-padded (ids, targets) tensors; targets are -100 except answer + <eos>.

    ``targets[:, t]`` is the label for the prediction made at position ``t`` (already
    shifted), so the loss is ``cross_entropy(logits[:, t], targets[:, t])``.
    """
    import torch

    seqs, n_prompt = [], []
    for p in items:
        prompt = tokenizer.encode(p.prompt)
        seqs.append(prompt + tokenizer.encode(p.answer) + [tokenizer.eos_token_id])
        n_prompt.append(len(prompt))
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)  # (B, T)
    targets = torch.full((len(seqs), width), -100, dtype=torch.long)  # (B, T)
    for row, (s, k) in enumerate(zip(seqs, n_prompt)):
        ids[row, : len(s)] = torch.tensor(s)
        targets[row, k - 1 : len(s) - 1] = torch.tensor(s[k:])
    return ids, targets


def teacher_batch(cfg: WarmstartConfig, items: list[Problem], rng: random.Random) -> list[Problem]:
    """``items`` with the demonstrator's answers (fresh draws of its flaws from ``rng``)."""
    pad_width = answer_width(cfg.max_digits, cfg.ops)
    return [
        Problem(
            p.prompt,
            teacher_answer(
                p,
                carry_drop=cfg.carry_drop,
                final_carry_drop=cfg.final_carry_drop,
                zero_pad=cfg.zero_pad,
                pad_width=pad_width,
                rng=rng,
            ),
        )
        for p in items
    ]


def _lr_at(step: int, cfg: WarmstartConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


def train_problems(cfg: WarmstartConfig) -> list[Problem]:
    held = heldout_problems(cfg.exclude_heldout, **task_kwargs(cfg))
    # Small spaces (e.g. 2-digit addition) cannot supply train_problems distinct prompts.
    room = int(0.8 * (count_distinct(**task_kwargs(cfg)) - len(held)))
    return problems(
        min(cfg.train_problems, room),
        seed=cfg.data_seed,
        exclude={p.prompt for p in held},
        **task_kwargs(cfg),
    )


def task_kwargs(cfg: WarmstartConfig) -> dict:
    """The task distribution of ``cfg`` as keyword arguments of demo.task functions."""
    return {"max_digits": cfg.max_digits, "ops": cfg.ops, "min_digits": cfg.min_digits}


def warmstart(
    out_dir: str | Path,
    config: WarmstartConfig | None = None,
    *,
    progress: bool = True,
    force: bool = False,
    **overrides,
) -> Path:
    """Train (or find cached) the warm-start model in ``out_dir`` and return its path.

    ``overrides`` are ``WarmstartConfig`` fields, e.g. ``warmstart(d, steps=10)``.
    """
    cfg = config or WarmstartConfig()
    if overrides:
        cfg = WarmstartConfig.from_dict({**asdict(cfg), **overrides})
    out = Path(out_dir)
    if not force and is_cached(out, cfg):
        log.info("warm-start cached in %s (hash %s)", out, cfg.hash())
        return out

    import torch  # heavy imports only when there is training to do
    import torch.nn.functional as F
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM

    from demo import model as model_factory
    from demo.evaluate import evaluate, load_tokenizer

    t0 = time.perf_counter()
    marker = out / MARKER
    if marker.exists():
        marker.unlink()  # the directory is being rewritten: no stale claim survives a crash
    model_factory.create_tiny_model(
        out,
        hidden_size=cfg.hidden_size,
        layers=cfg.layers,
        heads=cfg.heads,
        kv_heads=cfg.kv_heads,
        intermediate_size=cfg.intermediate_size,
        max_position=cfg.max_position,
        seed=cfg.model_seed,
    )
    tokenizer = load_tokenizer(out)
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    model.train()

    data = train_problems(cfg)
    pad = tokenizer.pad_token_id
    gen = torch.Generator().manual_seed(cfg.seed)
    teacher_rng = random.Random(cfg.seed)
    flawed = bool(cfg.carry_drop or cfg.final_carry_drop or cfg.zero_pad)
    if not flawed:
        ids, targets = encode_examples(tokenizer, data)  # (P, T), (P, T)
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay
    )
    bar = tqdm(range(cfg.steps), desc="warm-start SFT", disable=not progress, mininterval=0.5)
    ema = None
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, cfg)
        idx = torch.randint(0, len(data), (cfg.batch_size,), generator=gen)
        if flawed:  # the flawed teacher answers afresh every time
            batch = teacher_batch(cfg, [data[i] for i in idx.tolist()], teacher_rng)
            x, y = encode_examples(tokenizer, batch)  # (B, T)
        else:
            x, y = ids[idx], targets[idx]  # (B, T)
        used = int((x != pad).sum(1).max())
        x, y = x[:, :used], y[:, :used]
        logits = model(input_ids=x, attention_mask=(x != pad).long()).logits  # (B, T, V)
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % 20 == 0:
            bar.set_postfix(loss=f"{ema:.3f}")
    train_seconds = time.perf_counter() - t0

    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    held = heldout_problems(cfg.eval_problems, **task_kwargs(cfg))
    result = evaluate(model, held, tokenizer=tokenizer)
    meta = {
        "config_hash": cfg.hash(),
        "config": asdict(cfg),
        "heldout_accuracy": result.accuracy,
        "heldout_numeric_accuracy": result.numeric_accuracy,
        "heldout_n": result.n,
        "final_loss": ema,
        "train_seconds": round(train_seconds, 2),
        "params": sum(p.numel() for p in model.parameters()),
    }
    tmp = out / (MARKER + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    tmp.replace(marker)
    log.info(
        "warm-start done in %.1fs: held-out accuracy %.3f (n=%d)",
        train_seconds,
        result.accuracy,
        result.n,
    )
    return out
