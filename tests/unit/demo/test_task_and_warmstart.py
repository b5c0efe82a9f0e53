"""Fast checks of the demo's task, tokenizer, warm-start cache and evaluation."""

from __future__ import annotations

import json
import random

import pytest

from demo.task import (
    Problem,
    answer_width,
    column_sum,
    count_distinct,
    heldout_problems,
    problems,
    teacher_answer,
)

TINY = dict(
    hidden_size=32,
    layers=1,
    heads=2,
    kv_heads=1,
    intermediate_size=64,
    steps=4,
    batch_size=8,
    warmup_steps=2,
    train_problems=300,
    eval_problems=20,
)


# --- task -------------------------------------------------------------------------------


def test_problems_are_deterministic_distinct_and_correct():
    a = problems(300, seed=7, max_digits=3, ops="+-*")
    assert a == problems(300, seed=7, max_digits=3, ops="+-*")
    assert a != problems(300, seed=8, max_digits=3, ops="+-*")
    assert len({p.prompt for p in a}) == 300
    for p in a:
        x, op, y = next((p.prompt[:-1].partition(o) for o in "+-*" if o in p.prompt[1:-1]))
        assert p.answer == str(
            {"+": int.__add__, "-": int.__sub__, "*": int.__mul__}[op](int(x), int(y))
        )


def test_heldout_set_is_fixed_and_a_prefix():
    # The original 3-digit draw is unchanged (min_digits=1 keeps the old random calls).
    assert heldout_problems(2) == [Problem("177+858=", "1035"), Problem("72+6=", "78")]
    assert heldout_problems(50, max_digits=2) == heldout_problems(200, max_digits=2)[:50]


def test_train_problems_exclude_heldout():
    from demo.warmstart import WarmstartConfig, train_problems

    cfg = WarmstartConfig()
    train = {p.prompt for p in train_problems(cfg)}
    held = {
        p.prompt
        for p in heldout_problems(
            cfg.exclude_heldout, max_digits=cfg.max_digits, ops=cfg.ops, min_digits=cfg.min_digits
        )
    }
    assert len(held) == cfg.exclude_heldout and not train & held
    assert len(train) <= count_distinct(cfg.max_digits, cfg.ops) - len(held)


def test_exact_width_operands_and_exhaustion():
    ps = problems(100, seed=1, max_digits=2, min_digits=2)
    assert all(len(x) == 2 for p in ps for x in p.prompt[:-1].split("+"))
    assert count_distinct(2, "+", min_digits=2) == 90 * 90
    whole = problems(100, seed=0, max_digits=1)  # the whole space of one-digit sums
    assert len({p.prompt for p in whole}) == 100 == count_distinct(1, "+")
    assert whole == problems(100, seed=0, max_digits=1)
    held = {p.prompt for p in heldout_problems(10, max_digits=1)}
    assert len(problems(90, seed=1, max_digits=1, exclude=held)) == 90
    with pytest.raises(ValueError):
        problems(91, seed=1, max_digits=1, exclude=held)


def test_teacher_flaws():
    rng = random.Random(0)
    for p in problems(500, seed=3, max_digits=3):
        a, b = map(int, p.prompt[:-1].split("+"))
        assert column_sum(a, b) == p.answer == teacher_answer(p)
    assert column_sum(95, 17, carry_drop=1.0, rng=rng) == "2"  # 9+1 | 5+7 mod 10
    assert column_sum(95, 17, final_carry_drop=1.0, rng=rng) == "12"
    assert column_sum(84, 23, final_carry_drop=1.0, rng=rng) == "7"  # "07", zeros stripped
    assert teacher_answer(Problem("5+3=", "8"), zero_pad=1.0, pad_width=3, rng=rng) == "008"
    assert answer_width(2, "+") == 3 and answer_width(3, "+*") == 6
    drawn = [
        teacher_answer(Problem("5+3=", "8"), zero_pad=0.7, pad_width=3, rng=rng)
        for _ in range(2000)
    ]
    assert set(drawn) == {"8", "008"} and 0.65 < drawn.count("008") / 2000 < 0.75


def test_teacher_batch_and_sft_targets():
    from demo.model import build_tokenizer
    from demo.warmstart import WarmstartConfig, encode_examples, teacher_batch, train_problems

    cfg = WarmstartConfig()
    items = train_problems(cfg)[:400]
    rng = random.Random(0)
    for _ in range(3):  # repeated draws stay bounded (no feedback between batches)
        batch = teacher_batch(cfg, items, rng)
        assert all(len(p.answer) <= answer_width(cfg.max_digits, cfg.ops) for p in batch)
        assert all(p.answer.lstrip("0") == q.answer for p, q in zip(batch, items))
    padded = sum(p.answer != q.answer for p, q in zip(batch, items))
    assert 0.5 < padded / len(items) < 0.7  # 0.7 of the answers shorter than 3 chars
    tok = build_tokenizer()
    ids, targets = encode_examples(tok, [Problem("12+3=", "15")])
    # targets are shifted: the prediction at the last prompt token is the first answer char
    assert tok.decode(ids[0].tolist(), skip_special_tokens=True) == "12+3=15"
    assert targets[0].tolist() == [-100] * 4 + tok.encode("15") + [tok.eos_token_id, -100]


# --- tokenizer --------------------------------------------------------------------------


def test_tokenizer_round_trip_and_autotokenizer_agreement(tmp_path):
    from transformers import AutoTokenizer

    from demo.evaluate import load_tokenizer
    from demo.model import build_tokenizer

    tok = build_tokenizer()
    tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    loaded, auto = load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(str(tmp_path))
    texts = ["47+385=", "0", "-12", "999*99=98901", "(1+2)*3=9", "1 + 2 = 3"]
    for text in texts:
        ids = tok.encode(text)
        assert len(ids) == len(text)  # one token per character
        assert tok.decode(ids) == text
        assert loaded.encode(text) == ids
        if " " not in text:  # vLLM uses AutoTokenizer, which becomes Qwen2Tokenizer here
            assert auto.encode(text) == ids and auto.decode(ids) == text
    assert tok.decode([*tok.encode("12"), tok.eos_token_id], skip_special_tokens=True) == "12"


# --- evaluation ---------------------------------------------------------------------------


class ScriptedModel:
    """Stands in for a causal LM: 'generates' fixed continuations (tests the decoding)."""

    training = False

    def __init__(self, tok, continuations: dict[str, list]):
        self.tok, self.cont = tok, continuations

    def eval(self):
        return self

    def train(self, mode=True):
        return self

    def generate(self, input_ids, attention_mask, max_new_tokens, pad_token_id, **_):
        import torch

        rows = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            prompt = self.tok.decode([i for i, m in zip(ids, mask) if m])
            new = (self.cont[prompt] + [pad_token_id] * max_new_tokens)[:max_new_tokens]
            rows.append(ids + new)
        return torch.tensor(rows)


def test_evaluate_on_a_hand_made_case():
    from demo.evaluate import evaluate, greedy_accuracy
    from demo.model import build_tokenizer

    tok = build_tokenizer()
    e = tok.eos_token_id
    enc = tok.encode
    cases = {
        "1+1=": (enc("2") + [e], True),
        "10+2=": (enc("12") + [e, *enc("99")], True),  # text after <eos> is ignored
        "7+8=": (enc("15") + enc("1"), False),  # never stops
        "5+5=": (enc("010") + [e], False),  # zero-padded: exact match fails
        "9+9=": (enc("1") + [e, *enc("8")], False),  # stops early
    }
    answers = {"1+1=": "2", "10+2=": "12", "7+8=": "15", "5+5=": "10", "9+9=": "18"}
    model = ScriptedModel(tok, {k: v[0] for k, v in cases.items()})
    probs = [Problem(k, answers[k]) for k in cases]
    result = evaluate(model, probs, tokenizer=tok, batch_size=2, max_new_tokens=4)
    assert [ex["correct"] for ex in result.examples] == [v[1] for v in cases.values()]
    assert result.correct == 2 and result.accuracy == pytest.approx(0.4)
    assert result.numeric_accuracy == pytest.approx(0.6)  # "010" is the right number
    assert greedy_accuracy(model, probs[:2], tokenizer=tok) == 1.0


def test_left_padded_batches_match_single_prompts(tmp_path):
    from demo.evaluate import greedy_completions, load_model
    from demo.model import create_tiny_model

    path = create_tiny_model(
        tmp_path / "m", hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64, seed=3
    )
    model, tok = load_model(path)
    prompts = ["1+2=", "47+385=", "5=", "123+45="]
    batched = greedy_completions(model, tok, prompts, batch_size=4, max_new_tokens=5)
    single = [greedy_completions(model, tok, [p], max_new_tokens=5)[0] for p in prompts]
    assert batched == single


# --- warm-start ---------------------------------------------------------------------------


def test_warmstart_trains_records_and_caches(tmp_path, monkeypatch):
    import demo.model
    from demo.warmstart import WarmstartConfig, is_cached, read_marker, warmstart

    out = warmstart(tmp_path / "ws", progress=False, **TINY)
    meta = read_marker(out)
    cfg = WarmstartConfig(**TINY)
    assert meta["config_hash"] == cfg.hash() and is_cached(out, cfg)
    assert 0.0 <= meta["heldout_accuracy"] <= 1.0 and meta["heldout_n"] == 20
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()

    def no_training(*a, **k):
        raise AssertionError("cached warm-start must not retrain")

    monkeypatch.setattr(demo.model, "create_tiny_model", no_training)
    assert warmstart(tmp_path / "ws", progress=False, **TINY) == out
    assert not is_cached(out, WarmstartConfig(**{**TINY, "steps": 5}))
    with pytest.raises(ValueError):
        WarmstartConfig.from_dict({"stepz": 3})


def test_warmstart_is_deterministic(tmp_path):
    from safetensors.torch import load_file

    from demo.warmstart import warmstart

    a = load_file(warmstart(tmp_path / "a", progress=False, **TINY) / "model.safetensors")
    b = load_file(warmstart(tmp_path / "b", progress=False, **TINY) / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
