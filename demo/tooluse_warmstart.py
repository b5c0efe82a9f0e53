"""The tool-use task's warm-start (supervised, on the demonstrator's transcripts; cached by
config hash) and its greedy multi-turn evaluation against the calculator environment run in
this process (envs/calculator.py: the same rules the environment service applies).

    python -m demo.tooluse_warmstart warmstart --out DIR [--steps N ...]
    python -m demo.tooluse_warmstart eval --model DIR [--n 500] [--no-tool]
    python -m demo.tooluse_warmstart data --out FILE [--n 20000] [--heldout-out FILE]
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from demo.tooluse import CHARS, Demonstrator, encode_transcript, heldout, problems
from demo.warmstart import settings_hash, strict_config

MARKER = "tooluse.json"
MAX_TURN_TOKENS = 12  # a tool call or an answer fits


@dataclass(frozen=True)
class ToolWarmstartConfig:
    train_problems: int = 6000
    exclude_heldout: int = 1000
    data_seed: int = 1
    tool: float = 0.9
    full_call_hard: float = 0.15
    typo: float = 0.1
    hidden_size: int = 128
    layers: int = 4
    max_position: int = 64
    steps: int = 1000
    batch_size: int = 64
    lr: float = 1.5e-3  # 3e-3 leaves the copying of operands and results unlearned
    seed: int = 0
    eval_problems: int = 500
    threads: int = 1  # torch threads: a tiny model on a shared machine (more only contend)

    def hash(self) -> str:
        return settings_hash(self, 2, speed_only=("threads",))

    @classmethod
    def from_dict(cls, d: dict) -> "ToolWarmstartConfig":
        return strict_config(cls, d, "tool-use warm-start")


def is_cached(out: Path, cfg: ToolWarmstartConfig) -> bool:
    try:
        return json.loads((out / MARKER).read_text())["config_hash"] == cfg.hash()
    except (OSError, ValueError, KeyError):
        return False


def warmstart(out: str | Path, cfg: ToolWarmstartConfig | None = None) -> dict:
    """Train (or find cached) the tool-use warm-start in ``out``; returns its marker."""
    cfg, out = cfg or ToolWarmstartConfig(), Path(out)
    if is_cached(out, cfg):
        return json.loads((out / MARKER).read_text())
    import torch
    from tqdm.auto import tqdm

    from demo import model as model_factory

    torch.set_num_threads(cfg.threads)
    start = time.perf_counter()
    (out / MARKER).unlink(missing_ok=True)
    model_factory.create_tiny_model(
        out, hidden_size=cfg.hidden_size, layers=cfg.layers, max_position=cfg.max_position,
        seed=cfg.seed, chars=CHARS,
    )  # fmt: skip
    from demo.evaluate import load_model

    model, tokenizer = load_model(out)
    model.train()
    exclude = {p.prompt for p in heldout(cfg.exclude_heldout)}
    data = problems(cfg.train_problems, cfg.data_seed, exclude)
    teacher = Demonstrator(cfg.tool, cfg.full_call_hard, cfg.typo)
    rng, gen = random.Random(cfg.seed), torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.01)
    for step in tqdm(range(cfg.steps), desc="tool-use warm-start", mininterval=2.0):
        for group in opt.param_groups:  # linear warm-up, then cosine to a tenth
            group["lr"] = cfg.lr * min(1.0, (step + 1) / 50) * (0.55 + 0.45 * _cos(step, cfg.steps))
        idx = torch.randint(0, len(data), (cfg.batch_size,), generator=gen).tolist()
        rows = [encode_transcript(tokenizer, data[i].prompt, teacher.transcript(data[i], rng))
                for i in idx]  # fmt: skip
        x, y = _padded(rows, tokenizer.pad_token_id)
        logits = model(input_ids=x, attention_mask=(x != tokenizer.pad_token_id).long()).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    held = heldout(cfg.eval_problems)
    meta = {
        "config_hash": cfg.hash(),
        "config": asdict(cfg),
        "train_seconds": round(time.perf_counter() - start, 1),
        "params": sum(p.numel() for p in model.parameters()),
        "heldout": evaluate(model, tokenizer, held),
        "heldout_without_tool": evaluate(model, tokenizer, held, tool=False),
    }
    (out / MARKER).write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def _cos(step: int, steps: int) -> float:
    import math

    return math.cos(math.pi * step / max(steps - 1, 1))


def _padded(rows, pad: int):
    import torch

    width = max(len(ids) for ids, _ in rows)
    x = torch.full((len(rows), width), pad, dtype=torch.long)  # (B, T)
    y = torch.full((len(rows), width), -100, dtype=torch.long)  # (B, T)
    for r, (ids, labels) in enumerate(rows):
        x[r, : len(ids)], y[r, : len(labels)] = torch.tensor(ids), torch.tensor(labels)
    return x, y


def evaluate(model, tokenizer, held, tool: bool = True, max_turns: int = 4) -> dict:
    """Greedy episodes of ``held`` against the calculator (``tool`` off: every call answered
    '?'): success overall and per half (easy: 1-digit factor), and the share of tool calls."""
    from envs.calculator import Calculator
    from envs.config import CalculatorConfig

    env = Calculator(CalculatorConfig(tool=tool))
    results = greedy_episodes(model, tokenizer, held, env, max_turns)
    solved = [r for r, _ in results]
    calls = [c for _, c in results]
    easy = [s for s, p in zip(solved, held) if not p.hard]
    hard = [s for s, p in zip(solved, held) if p.hard]
    return {
        "success": sum(solved) / len(held),
        "success_easy": sum(easy) / max(len(easy), 1),
        "success_hard": sum(hard) / max(len(hard), 1),
        "tool_calls_per_episode": sum(calls) / len(held),
        "n": len(held),
    }


def greedy_episodes(model, tokenizer, held, env, max_turns: int) -> list[tuple[bool, int]]:
    """(solved, tool calls) of each problem's greedy episode; turns end at ']' or <eos>."""
    import torch

    close = tokenizer.convert_tokens_to_ids("]")
    eos = tokenizer.eos_token_id
    seqs = [list(tokenizer.encode(p.prompt)) for p in held]
    states = [env.reset(p.prompt, p.answer, {}, 0)[0] for p in held]
    turn_start = [len(s) for s in seqs]
    turns, out = [1] * len(held), [None] * len(held)
    live = list(range(len(held)))
    with torch.no_grad():
        while live:
            x, mask = _left_padded([seqs[i] for i in live], tokenizer.pad_token_id)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding: count real tokens
            logits = model(input_ids=x, attention_mask=mask, position_ids=positions).logits
            nxt = logits[:, -1].argmax(-1).tolist()
            still = []
            for i, t in zip(live, nxt):
                seqs[i].append(t)
                ended = t in (close, eos) or len(seqs[i]) - turn_start[i] >= MAX_TURN_TOKENS
                if not ended:
                    still.append(i)
                    continue
                text = tokenizer.decode(seqs[i][turn_start[i] :], skip_special_tokens=True)
                answer = env.step(states[i], turns[i], text, t == eos)
                if answer.done or turns[i] >= max_turns:
                    out[i] = (answer.reward > 0, int(answer.info.get("calls", 0)))
                    continue
                seqs[i] += list(tokenizer.encode(answer.observation, add_special_tokens=False))
                turns[i] += 1
                turn_start[i] = len(seqs[i])
                still.append(i)
            live = still
    return [o if o is not None else (False, 0) for o in out]


def _left_padded(seqs, pad: int):
    import torch

    width = max(len(s) for s in seqs)
    x = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        x[r, width - len(s) :], mask[r, width - len(s) :] = torch.tensor(s), 1
    return x, mask


def eval_dir(model_dir: str | Path, n: int, tool: bool = True) -> dict:
    from demo.evaluate import load_model

    model, tokenizer = load_model(model_dir)
    return evaluate(model, tokenizer, heldout(n), tool=tool)


def write_jsonl(out: Path, rows) -> int:
    """Problems as {"prompt", "reference"} JSONL rows (the learner's data format)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"prompt": p.prompt, "reference": p.answer}) for p in rows]
    out.write_text("".join(line + chr(10) for line in lines))
    return len(rows)


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m demo.tooluse_warmstart", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    ws = sub.add_parser("warmstart", help="SFT on the demonstrator's transcripts (cached)")
    ws.add_argument("--out", required=True)
    for f in fields(ToolWarmstartConfig):
        ws.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=type(f.default))
    ev = sub.add_parser("eval", help="greedy episodes against the calculator, one JSON object")
    ev.add_argument("--model", required=True)
    ev.add_argument("--n", type=int, default=500)
    ev.add_argument("--no-tool", action="store_true", help="every tool call answered '?'")
    data = sub.add_parser("data", help="write the RL prompt set (JSONL)")
    data.add_argument("--out", required=True)
    data.add_argument("--n", type=int, default=20000)
    data.add_argument("--heldout-out", default="", help="also write n held-out prompts here")
    data.add_argument("--heldout-n", type=int, default=200)
    args = ap.parse_args(argv)
    if args.command == "warmstart":
        given = {f.name: getattr(args, f.name) for f in fields(ToolWarmstartConfig)}
        cfg = ToolWarmstartConfig.from_dict(
            {**asdict(ToolWarmstartConfig()), **{k: v for k, v in given.items() if v is not None}}
        )
        meta = warmstart(args.out, cfg)
        print(json.dumps({"model": str(args.out), **{k: meta[k] for k in ("heldout", "params")}}))
    elif args.command == "eval":
        print(json.dumps(eval_dir(args.model, args.n, tool=not args.no_tool)))
    else:
        exclude = {p.prompt for p in heldout(ToolWarmstartConfig().exclude_heldout)}
        n = write_jsonl(Path(args.out), problems(args.n, 7, exclude))
        if args.heldout_out:
            write_jsonl(Path(args.heldout_out), heldout(args.heldout_n))
        print(json.dumps({"prompts": n}))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
