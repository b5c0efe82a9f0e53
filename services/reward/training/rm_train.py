"""Train a sequence-scoring reward model on pairwise preferences (Bradley–Terry loss with a margin).

    python -m services.reward.training.rm_train --data prefs.jsonl --out runs/rm \\
        [--backbone DIR] [--max-seconds 300]
    python -m services.reward.training.rm_train --generate 20000 --data prefs.jsonl \\
        --out runs/rm   # make the set first

Input: JSONL lines ``{"prompt", "chosen", "rejected"}``, optionally with a numeric ``margin`` (how
much better chosen is, e.g. a rating difference). 10% of the prompts (all their pairs) are
held out for validation. Model: a transformers backbone with a scalar head
(``AutoModelForSequenceClassification``, num_labels=1, scored at the last token); without
``--backbone`` a tiny char-level Qwen2 is built from scratch (its vocabulary: the data's
characters). Loss: ``-log sigmoid(s_chosen - s_rejected - m)`` plus a small penalty on the
scores' size so they stay centred; m is the pair's own ``margin`` times ``--margin-scale`` when the
data carries one (on by default; ``--no-data-margin`` ignores them), else ``--margin``.
Reports (one JSON object on stdout, also saved in DIR/brorl_rm.json): validation pairwise
accuracy, calibration (ECE of sigmoid(score difference), 10 bins), steps, seconds. DIR is loadable
with ``from_pretrained`` and served by the reward service (``type: reward_model``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import sys
import time
from pathlib import Path

from services.reward.functions.rm_format import META_FILE, encode, fill_template

log = logging.getLogger("brorl.rm_train")


def load_pairs(path: str | Path) -> list[dict]:
    pairs = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{path}:{lineno}: not JSON ({exc})") from None
        if not isinstance(row, dict) or not all(
            isinstance(row.get(k), str) for k in ("prompt", "chosen", "rejected")
        ):
            raise ValueError(f"{path}:{lineno}: needs string fields prompt, chosen, rejected")
        m = row.get("margin")
        if m is not None and (
            isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m)
        ):
            raise ValueError(f"{path}:{lineno}: margin must be a finite number, got {m!r}")
        pairs.append(row)
    if len(pairs) < 10:
        raise ValueError(f"{path}: {len(pairs)} pairs; need at least 10")
    return pairs


def pair_margins(pairs: list[dict], default: float, scale: float, use_data: bool) -> list[float]:
    """The margin m of each pair in the loss: its own ``margin`` × ``scale`` when the data has
    one and ``use_data``, else ``default``."""
    return [
        scale * float(p["margin"]) if use_data and p.get("margin") is not None else default
        for p in pairs
    ]


def split_pairs(
    pairs: list[dict], val_fraction: float = 0.1, seed: int = 0
) -> tuple[list[dict], list[dict]]:
    """Hold out ``val_fraction`` of the distinct prompts, with all their pairs (no prompt in
    both)."""
    prompts = sorted({p["prompt"] for p in pairs})
    random.Random(seed).shuffle(prompts)
    held = set(prompts[: max(1, round(len(prompts) * val_fraction))])
    return [p for p in pairs if p["prompt"] not in held], [p for p in pairs if p["prompt"] in held]


def pair_metrics(diffs: list[float], bins: int = 10) -> dict:
    """Accuracy (chosen scored higher) and ECE of P(chosen preferred) = sigmoid(diff).

    Calibration is measured on the confidence of the predicted side, max(p, 1 - p), against whether
    that side is the chosen one — the same as scoring each pair in both orders.
    """
    n = len(diffs)
    correct = [d > 0 for d in diffs]
    conf = [1 / (1 + math.exp(-abs(d))) for d in diffs]
    ece = 0.0
    for b in range(bins):
        lo, hi = 0.5 + 0.5 * b / bins, 0.5 + 0.5 * (b + 1) / bins
        idx = [i for i, c in enumerate(conf) if lo <= c < hi or (b == bins - 1 and c == hi)]
        if idx:
            acc = sum(correct[i] for i in idx) / len(idx)
            ece += len(idx) / n * abs(acc - sum(conf[i] for i in idx) / len(idx))
    return {"accuracy": sum(correct) / n, "ece": ece, "mean_diff": sum(diffs) / n}


CHAR_SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]


def char_tokenizer(texts: list[str]):
    """A character-level tokenizer over every character of ``texts`` (ids 0..3 special): what a
    from-scratch backbone needs, whatever language the preference data is in."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted({c for t in texts for c in t} - set("".join(CHAR_SPECIALS)) | set(" "))
    vocab = {tok: i for i, tok in enumerate(CHAR_SPECIALS + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")  # one char, one token
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


def build_model(
    backbone: str | None, hidden: int, layers: int, seed: int, heads: int = 4, texts: list[str] = ()
):
    """A backbone from ``backbone``, or a tiny Qwen2 from scratch over the characters of
    ``texts``."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(seed)
    if backbone:
        tok = AutoTokenizer.from_pretrained(backbone)
        model = AutoModelForSequenceClassification.from_pretrained(backbone, num_labels=1)
    else:
        from transformers import Qwen2Config, Qwen2ForSequenceClassification

        tok = char_tokenizer(list(texts))
        config = Qwen2Config(
            vocab_size=len(tok),
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2),
            intermediate_size=hidden * 3,
            max_position_embeddings=128,
            num_labels=1,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        model = Qwen2ForSequenceClassification(config)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    model.config.pad_token_id = tok.pad_token_id
    return model, tok


def score_texts(
    model, tok, texts: list[str], max_length: int, append_eos: bool, batch_size: int = 256
) -> list[float]:
    import torch

    out: list[float] = []
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            ids, mask = encode(tok, texts[i : i + batch_size], max_length, append_eos)
            out.extend(model(input_ids=ids, attention_mask=mask).logits[:, 0].tolist())
    return out


def evaluate(
    model, tok, pairs: list[dict], template: str, max_length: int, append_eos: bool
) -> dict:
    model.eval()
    chosen = score_texts(
        model,
        tok,
        [fill_template(template, p["prompt"], p["chosen"]) for p in pairs],
        max_length,
        append_eos,
    )
    rejected = score_texts(
        model,
        tok,
        [fill_template(template, p["prompt"], p["rejected"]) for p in pairs],
        max_length,
        append_eos,
    )
    model.train()
    return pair_metrics([c - r for c, r in zip(chosen, rejected)])


def train(args) -> dict:
    """Train a pairwise reward model on ``args.data`` (margin loss), evaluate it on the held-out
    pairs and save it with its metadata in ``args.out``; returns the metrics."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.monotonic()
    pairs = load_pairs(args.data)
    train_pairs, val_pairs = split_pairs(pairs, args.val_fraction, args.seed)
    texts = [
        fill_template(args.template, p["prompt"], p[side])
        for p in pairs
        for side in ("chosen", "rejected")
    ]
    model, tok = build_model(args.backbone, args.hidden, args.layers, args.seed, args.heads, texts)
    step, losses = _fit(model, tok, train_pairs, val_pairs, args, start)
    train_s = time.monotonic() - start
    metrics = {
        **_validation(model, tok, val_pairs, args),
        "train_pairs": len(train_pairs),
        "val_pairs": len(val_pairs),
        "steps": step,
        "final_loss": sum(losses[-50:]) / max(1, len(losses[-50:])),
        "train_seconds": train_s,
        "total_seconds": time.monotonic() - start,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    data_margins = sum(p.get("margin") is not None for p in train_pairs)
    meta = {
        "template": args.template,
        "append_eos": not args.no_eos,
        "max_length": args.max_length,
        "margin": args.margin,
        "data_margins": data_margins if not args.no_data_margin else 0,
        "margin_scale": args.margin_scale,
        "metrics": metrics,
    }
    (out / META_FILE).write_text(json.dumps(meta, indent=2))
    return metrics


def _fit(model, tok, train_pairs, val_pairs, args, start: float) -> tuple[int, list[float]]:
    """The optimisation loop: margin loss on sampled batches of pairs until ``args.steps`` or
    ``args.max_seconds``; returns the steps made and their losses."""
    import torch
    import torch.nn.functional as F

    template, eos = args.template, not args.no_eos
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    total_steps = args.steps or 10**9
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup))
    rng = random.Random(args.seed)
    model.train()
    step, losses = 0, []
    deadline = start + args.max_seconds
    while step < total_steps and time.monotonic() < deadline:
        batch = rng.sample(train_pairs, min(args.batch_size, len(train_pairs)))
        texts = [fill_template(template, p["prompt"], p["chosen"]) for p in batch] + [
            fill_template(template, p["prompt"], p["rejected"]) for p in batch
        ]
        ids, mask = encode(tok, texts, args.max_length, eos)
        scores = model(input_ids=ids, attention_mask=mask).logits[:, 0]  # (2B,)
        chosen, rejected = scores[: len(batch)], scores[len(batch) :]
        m = torch.tensor(
            pair_margins(batch, args.margin, args.margin_scale, not args.no_data_margin)
        )  # (B,)
        loss = -F.logsigmoid(chosen - rejected - m).mean() + args.center * (scores**2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        losses.append(loss.item())
        if step % args.log_every == 0:
            probe = ""
            if args.probe:  # progress only: a slice of the validation set, no decision uses it
                acc = evaluate(model, tok, val_pairs[: args.probe], template, args.max_length, eos)
                probe = " probe_acc %.3f" % acc["accuracy"]
            mean = sum(losses[-args.log_every :]) / args.log_every
            log.info("step %d loss %.4f%s (%.0fs)", step, mean, probe, time.monotonic() - start)
    return step, losses


def _validation(model, tok, val_pairs, args) -> dict:
    """Accuracy, calibration and score gap on the held-out pairs, and accuracy per pair kind."""
    template, eos = args.template, not args.no_eos
    val = evaluate(model, tok, val_pairs, template, args.max_length, eos)
    by_kind = {}
    for kind in sorted({p["kind"] for p in val_pairs if isinstance(p.get("kind"), str)}):
        subset = [p for p in val_pairs if p.get("kind") == kind]
        by_kind[kind] = round(
            evaluate(model, tok, subset, template, args.max_length, eos)["accuracy"], 4
        )
    return {
        "val_accuracy": val["accuracy"],
        "val_ece": val["ece"],
        "val_mean_diff": val["mean_diff"],
        "val_accuracy_by_kind": by_kind,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m services.reward.training.rm_train", description=__doc__.split("\n")[0]
    )
    p.add_argument("--data", required=True, help="preference JSONL (prompt, chosen, rejected)")
    p.add_argument("--out", required=True, help="directory to save the reward model in")
    p.add_argument(
        "--generate", type=int, default=0, help="first write this many arithmetic pairs to --data"
    )
    p.add_argument(
        "--backbone", default="", help="local transformers model dir; empty: tiny char-level Qwen2"
    )
    p.add_argument(
        "--hidden", type=int, default=64, help="hidden size of the from-scratch backbone"
    )
    p.add_argument("--layers", type=int, default=3, help="layers of the from-scratch backbone")
    p.add_argument(
        "--heads", type=int, default=4, help="attention heads of the from-scratch backbone"
    )
    p.add_argument(
        "--max-seconds",
        type=float,
        default=270.0,
        help="stop training after this long (the default leaves room for evaluation in 5 minutes)",
    )
    p.add_argument(
        "--steps", type=int, default=0, help="stop after this many steps (0: time limit only)"
    )
    p.add_argument("--batch-size", type=int, default=64, help="pairs per step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100, help="linear warm-up steps")
    p.add_argument(
        "--margin", type=float, default=0.0, help="m in -log sigmoid(s_c - s_r - m) for pairs "
        "without a margin of their own"
    )
    p.add_argument(
        "--margin-scale", type=float, default=1.0, help="multiplies the data's own margins"
    )
    p.add_argument(
        "--no-data-margin", action="store_true", help="ignore the data's margin field"
    )
    p.add_argument("--center", type=float, default=1e-3, help="weight of the mean squared score")
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--max-length", type=int, default=64, help="tokens per sequence")
    p.add_argument("--template", default="{prompt}{completion}")
    p.add_argument(
        "--no-eos", action="store_true", help="do not append the EOS token before scoring"
    )
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=500)
    p.add_argument(
        "--probe",
        type=int,
        default=0,
        help="log accuracy on this many validation pairs at each log",
    )
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.generate:
        from services.reward.training.prefgen import generate, write_jsonl

        write_jsonl(generate(args.generate, args.seed), args.data)
    try:
        metrics = train(args)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
