"""The tool-use task (demo/tooluse.py): the demonstrator's imperfect tool use in the shares its
settings give, and the supervised transcripts' labels on the policy's tokens only.

Mutations tried, each failing a test here: the hard problems' call carrying the whole factor
(or the easy ones' only its first digit), the environment's segment labelled like the policy's,
the labels left unshifted."""

from __future__ import annotations

import random

from demo.model import build_tokenizer
from demo.tooluse import CHARS, Demonstrator, encode_transcript, heldout, problems


def test_problems_are_distinct_and_the_heldout_set_is_left_out():
    held = {p.prompt for p in heldout(200)}
    train = problems(3000, seed=1, exclude=held)
    assert len({p.prompt for p in train}) == 3000 and not held & {p.prompt for p in train}
    assert all(int(p.answer) == eval(p.prompt[:-1]) for p in train[:50])  # noqa: S307 - test data
    # half hard in a small set; a large one runs out of the 720 easy problems
    assert 0.4 < sum(p.hard for p in heldout(200)) / 200 < 0.6


def test_the_demonstrator_calls_with_one_digit_of_a_two_digit_factor_most_of_the_time():
    rng, teacher = random.Random(0), Demonstrator(tool=0.9, full_call_hard=0.15, typo=0.0)
    shares = {True: [0, 0, 0], False: [0, 0, 0]}  # hard -> [guess, full call, cut call]
    for p in problems(4000, seed=2):
        segments = teacher.transcript(p, rng)
        if len(segments) == 1:
            shares[p.hard][0] += 1
            continue
        (call, _), (result, policy), (answer, _) = segments
        a, b = p.prompt[:-1].split("*")
        assert not policy and result == f"{answer}|" and answer == str(eval(call[1:-1]))  # noqa: S307
        shares[p.hard][1 if call == f"[{a}*{b}]" else 2] += 1
        assert call in (f"[{a}*{b}]", f"[{a}*{b[0]}]")
    easy, hard = shares[False], shares[True]
    assert easy[2] == 0 and 0.07 < easy[0] / sum(easy) < 0.13
    assert 0.1 < hard[1] / (hard[1] + hard[2]) < 0.2


def test_the_transcript_is_labelled_on_the_policys_tokens_only():
    tok = build_tokenizer(CHARS)
    ids, labels = encode_transcript(tok, "37*48=", [("[37*48]", True), ("1776|", False),
                                                    ("1776", True)])  # fmt: skip
    text = "37*48=[37*48]1776|1776"
    assert ids == tok.encode(text) + [tok.eos_token_id]
    # labels[t] is what position t predicts: the next token, where that token is the policy's
    policy = [False] * 6 + [True] * 7 + [False] * 5 + [True] * 4 + [True]  # ... + <eos>
    want = [ids[t + 1] if policy[t + 1] else -100 for t in range(len(ids) - 1)] + [-100]
    assert labels == want
