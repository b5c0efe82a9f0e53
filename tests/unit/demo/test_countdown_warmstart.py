"""The Countdown warm-start (demo/countdown/warmstart.py): the loss reads the answer's tokens
only, pass@k against a brute force over subsets, the reward's checker as the judge, and a tiny
configuration end to end, cached by its hash."""

from __future__ import annotations

import itertools
import random

import pytest

from demo.countdown.task import Demonstrator, heldout, near_miss, reuse_slip
from demo.countdown.warmstart import (
    MARKER,
    CountdownWarmstartConfig,
    answer_loss,
    encode,
    is_cached,
    is_correct,
    pass_at_ks,
    padded,
    read_marker,
    tally,
    warmstart,
)

TINY = CountdownWarmstartConfig(
    train_problems=200, hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64,
    steps=3, batch_size=8, warmup_steps=1, eval_problems=40, passk_problems=2, passk_samples=4,
)  # fmt: skip


def test_labels_mark_the_answer_and_eos_only():
    from demo.model import build_tokenizer
    from demo.countdown.task import CHARS

    tok = build_tokenizer(CHARS)
    ids, labels = encode(tok, "3,7,25:78=", "3*25+7")
    head = len(tok.encode("3,7,25:78="))
    assert len(ids) == len(labels) == head + len("3*25+7") + 1
    kept = [t for t in labels if t != -100]
    assert tok.decode(kept[:-1]) == "3*25+7" and kept[-1] == tok.eos_token_id
    for t, label in enumerate(labels):  # already shifted: the label is the next token
        assert label == -100 or label == ids[t + 1]


def test_loss_is_the_mean_over_answer_tokens_not_the_prompt(tmp_path):
    """Fails if prompt positions are scored (the mean would then run over more tokens)."""
    import torch
    import torch.nn.functional as F

    from demo.countdown.task import CHARS
    from demo.evaluate import load_model
    from demo.model import create_tiny_model

    create_tiny_model(tmp_path, hidden_size=32, layers=1, heads=2, kv_heads=1,
                      intermediate_size=64, chars=CHARS)  # fmt: skip
    model, tok = load_model(tmp_path)
    pairs = [("3,7,25:78=", "3*25+7"), ("10,2,41,6:50=", "41+10-6/2")]
    x, y = padded([encode(tok, p, a) for p, a in pairs], tok.pad_token_id)
    with torch.no_grad():
        got = answer_loss(model, x, y, tok.pad_token_id)
        terms = []
        for row, (prompt, answer) in enumerate(pairs):
            single = torch.tensor([tok.encode(prompt + answer) + [tok.eos_token_id]])
            logp = F.log_softmax(model(input_ids=single).logits[0], -1)  # (T, V)
            head = len(tok.encode(prompt))
            for t in range(head - 1, single.shape[1] - 1):  # predictions of answer + <eos>
                terms.append(-logp[t, single[0, t + 1]])
    assert float(got) == pytest.approx(float(torch.stack(terms).mean()), rel=1e-4)


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Share of the k-subsets of n samples (c correct) holding a correct one, in float64."""
    flags = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(flags[i] for i in s) for s in subsets) / float(len(subsets))


def test_pass_at_ks_matches_brute_force():
    rng = random.Random(0)
    for n in (1, 2, 3, 4, 8):
        for _ in range(5):
            counts = [rng.randint(0, n) for _ in range(rng.randint(1, 4))]
            got = pass_at_ks(counts, n)
            assert set(got) == {str(k) for k in range(1, n + 1) if k & (k - 1) == 0} | {str(n)}
            for k, value in got.items():
                want = sum(brute_pass_at_k(n, c, int(k)) for c in counts) / len(counts)
                assert value == pytest.approx(want, abs=1e-12)


def test_the_judge_is_the_reward_checker():
    rng = random.Random(1)
    for p in heldout(30):
        right = Demonstrator(correct=1.0).answer(p, rng)
        assert is_correct(right, p) and is_correct("junk=" + right, p)
        assert not is_correct(near_miss(p, rng), p)
        slip = reuse_slip(p, rng)
        assert slip is None or not is_correct(slip, p)


def test_tally_counts_each_verdict_per_label_and_the_correct_ones_as_pass_at_1():
    from demo.countdown.solver import sample_solution, to_text

    rng = random.Random(3)
    held = [p for p in heldout(60) if p.label == "easy"][:4] + [
        p for p in heldout(60) if p.label == "hard"
    ][:2]
    right = [to_text(sample_solution(p.numbers, p.target, rng)) for p in held]
    a = held[1].numbers[0]
    texts = [
        right[0],
        f"{a}+{a}+" + "+".join(map(str, held[1].numbers[1:])),  # the first number twice
        right[2],
        "",
        "(" + right[4],  # unbalanced
        right[5] + "…",  # a completion that never stopped (demo.evaluate marks it)
    ]
    got = tally(texts, held)
    assert got["overall"] == pytest.approx(2 / 6) and got["n"] == 6
    assert got["by_label"] == {"easy": 0.5, "medium": None, "hard": 0.0}
    assert got["n_by_label"] == {"easy": 4, "medium": 0, "hard": 2}
    assert got["verdicts"]["easy"] == {"correct": 0.5, "no_expression": 0.25,
                                       "reused_number": 0.25}  # fmt: skip
    assert list(got["verdicts"]["easy"]) == ["correct", "no_expression", "reused_number"]
    assert got["verdicts"]["hard"] == {"bad_character": 0.5, "syntax": 0.5}
    assert got["verdicts"]["medium"] == {}
    with pytest.raises(ValueError):  # one completion per problem
        tally(texts[:5], held)


def test_rates_per_label_reach_the_demonstrator():
    d = CountdownWarmstartConfig(easy=0.5, medium=0.2, hard=0.01).demonstrator()
    assert (d.rate("easy"), d.rate("medium"), d.rate("hard")) == (0.5, 0.2, 0.01)


def test_tiny_warmstart_end_to_end_then_cached(tmp_path, monkeypatch):
    import demo.countdown.warmstart as ws

    meta = warmstart(tmp_path / "ws", TINY)
    assert is_cached(tmp_path / "ws", TINY) and read_marker(tmp_path / "ws") == meta
    assert (tmp_path / "ws" / "model.safetensors").exists()
    greedy = meta["greedy_pass_at_1"]
    assert greedy["n"] == 40 and set(greedy["by_label"]) == {"easy", "medium", "hard"}
    for label, shares in greedy["verdicts"].items():  # every answer has one verdict
        assert sum(shares.values()) == pytest.approx(1.0) or greedy["n_by_label"][label] == 0
        assert shares.get("correct", 0.0) == pytest.approx(greedy["by_label"][label] or 0.0)
    assert sum(greedy["n_by_label"].values()) == 40 and 0 <= greedy["overall"] <= 1
    assert meta["hard_sampled"]["n"] == 2 and set(meta["hard_sampled"]["pass_at_k"]) == {
        "1", "2", "4"
    }  # fmt: skip
    assert meta["params"] > 0 and meta["config_hash"] == TINY.hash()

    again = ws.measure(tmp_path / "ws", TINY, "medium")  # sampling only, no training
    assert again["label"] == "medium" and again["n"] == 2 and len(again["correct_per_problem"]) == 2

    def no_training(*a, **k):
        raise AssertionError("a cached warm-start must not train")

    monkeypatch.setattr(ws, "train", no_training)
    assert warmstart(tmp_path / "ws", TINY) == meta
    assert not is_cached(tmp_path / "ws", CountdownWarmstartConfig(**{**vars(TINY), "steps": 4}))
    (tmp_path / "ws" / MARKER).write_text("{broken")
    with pytest.raises(AssertionError, match="must not train"):
        warmstart(tmp_path / "ws", TINY)


def test_speed_settings_leave_the_hash_alone():
    assert CountdownWarmstartConfig(threads=2, sample_batch=7).hash() == (
        CountdownWarmstartConfig().hash()
    )
    with pytest.raises(ValueError, match="unknown"):
        CountdownWarmstartConfig.from_dict({"stepz": 3})
