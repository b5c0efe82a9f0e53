"""Greedy exact-match evaluation of a demo model (transformers, batched, left padding).

The completion is the text generated after the prompt up to the first ``<eos>``; a problem
counts as solved when that text equals the reference answer exactly. A completion that
never emits ``<eos>`` within ``max_new_tokens`` is wrong.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from demo.task import Problem


def load_tokenizer(path: str | Path):
    """The demo's character tokenizer from a model directory.

    ``AutoTokenizer`` is avoided on purpose: for ``model_type == "qwen2"`` transformers 5
    substitutes ``Qwen2Tokenizer``, whose byte-level pre-tokenizer drops spaces. The two
    agree on every string the task produces (digits, ``+-*=``), which is what vLLM sees.
    """
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(path))


def load_model(path: str | Path):
    """(model, tokenizer) from a model directory; float32, eval mode, on CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.eval()
    return model, load_tokenizer(path)


def default_max_new_tokens(problems: Sequence[Problem]) -> int:
    """Room for the longest reference answer, its ``<eos>`` and one spare token."""
    return max(len(p.answer) for p in problems) + 2


def left_padded(tokenizer, prompts: Sequence[str]):
    """(input_ids, attention_mask, width) of ``prompts`` left-padded to the longest: (B, T)."""
    import torch

    ids = [tokenizer.encode(p) for p in prompts]
    width = max(len(i) for i in ids)
    input_ids = torch.full((len(ids), width), tokenizer.pad_token_id, dtype=torch.long)  # (B, T)
    attention = torch.zeros((len(ids), width), dtype=torch.long)  # (B, T)
    for row, seq in enumerate(ids):
        input_ids[row, width - len(seq) :] = torch.tensor(seq)
        attention[row, width - len(seq) :] = 1
    return input_ids, attention, width


def greedy_completions(
    model, tokenizer, prompts: Sequence[str], *, batch_size: int = 256, max_new_tokens: int = 8
) -> list[str]:
    """Greedy completion text (up to, excluding, the first ``<eos>``) for each prompt."""
    import torch

    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    out: list[str] = []
    for start in range(0, len(prompts), batch_size):
        input_ids, attention, width = left_padded(tokenizer, prompts[start : start + batch_size])
        with torch.no_grad():
            gen = model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=eos,
                pad_token_id=pad,
            )[:, width:]  # (B, new)
        for row in gen.tolist():
            if eos in row:
                text = tokenizer.decode(row[: row.index(eos)], skip_special_tokens=True)
            else:  # never stopped: mark with a character no answer contains
                text = tokenizer.decode(row, skip_special_tokens=True) + "…"
            out.append(text)
    return out


def same_number(completion: str, answer: str) -> bool:
    """Whether ``completion`` is the answer's number in some other spelling (``"098"``)."""
    try:
        return int(completion) == int(answer)
    except ValueError:
        return False


@dataclass
class EvalResult:
    accuracy: float  # exact match: the score that counts
    n: int
    correct: int
    seconds: float
    numeric_accuracy: float = 0.0  # diagnostic: right number, any spelling ("098" for 98)
    examples: list[dict] = field(default_factory=list)  # a few (prompt, answer, completion)

    def to_dict(self) -> dict:
        return {
            "accuracy": self.accuracy,
            "n": self.n,
            "correct": self.correct,
            "numeric_accuracy": self.numeric_accuracy,
            "seconds": round(self.seconds, 3),
            "examples": self.examples,
        }


def evaluate(
    model_or_path,
    problems: Sequence[Problem],
    *,
    tokenizer=None,
    batch_size: int = 256,
    max_new_tokens: int | None = None,
    n_examples: int = 5,
) -> EvalResult:
    """Greedy exact-match accuracy of a model (or model directory) on ``problems``."""
    import torch

    if isinstance(model_or_path, (str, Path)):
        model, tok = load_model(model_or_path)
    else:
        model = model_or_path
        tok = tokenizer if tokenizer is not None else load_tokenizer(model.name_or_path)
    if not problems:
        raise ValueError("evaluate needs at least one problem")
    t0 = time.perf_counter()
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            completions = greedy_completions(
                model,
                tok,
                [p.prompt for p in problems],
                batch_size=batch_size,
                max_new_tokens=max_new_tokens or default_max_new_tokens(problems),
            )
    finally:
        model.train(was_training)
    hits = [c == p.answer for c, p in zip(completions, problems)]
    examples = [
        {"prompt": p.prompt, "answer": p.answer, "completion": c, "correct": h}
        for p, c, h in list(zip(problems, completions, hits))[:n_examples]
    ]
    numeric = sum(same_number(c, p.answer) for c, p in zip(completions, problems))
    return EvalResult(
        accuracy=sum(hits) / len(hits),
        n=len(hits),
        correct=sum(hits),
        seconds=time.perf_counter() - t0,
        numeric_accuracy=numeric / len(hits),
        examples=examples,
    )


def greedy_accuracy(
    model_or_path,
    problems: Sequence[Problem],
    *,
    batch_size: int = 256,
    tokenizer=None,
    max_new_tokens: int | None = None,
) -> float:
    """Fraction of ``problems`` whose greedy completion equals the answer exactly."""
    return evaluate(
        model_or_path,
        problems,
        tokenizer=tokenizer,
        batch_size=batch_size,
        max_new_tokens=max_new_tokens,
    ).accuracy
