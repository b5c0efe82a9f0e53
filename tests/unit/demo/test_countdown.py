"""The Countdown task: the exact solver against brute force through the reward function's own
parser, solutions drawn uniformly and written back as text, the generator's determinism, the
splits' disjointness, the prompt's characters and the demonstrator's rates."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from demo.countdown.task import (
    CHARS,
    LABELS,
    SPLITS,
    Demonstrator,
    Problem,
    TaskSpec,
    difficulty,
    heldout,
    label_stats,
    near_miss,
    probes,
    problems,
    reuse_slip,
    split_of,
)
from demo.countdown.solver import (
    additive,
    count_solutions,
    random_tree,
    sample_solution,
    to_text,
    trees,
    value,
    value_counts,
)
from services.reward.functions.countdown import Rejected, Verdict, check, evaluate, to_rpn


def expressions(items: list[str]):
    """Every fully parenthesised expression over ``items`` in this order."""
    if len(items) == 1:
        yield items[0]
        return
    for k in range(1, len(items)):
        for left in expressions(items[:k]):
            for right in expressions(items[k:]):
                for op in "+-*/":
                    yield f"({left}{op}{right})"


def brute_force(numbers: tuple[int, ...]) -> tuple[Counter, int]:
    """(value → how many expressions reach it, expressions in all), every order of the positions
    written out and read by the reward function's parser."""
    values, total = Counter(), 0
    for order in itertools.permutations(range(len(numbers))):
        for text in expressions([str(numbers[i]) for i in order]):
            total += 1
            try:
                values[int(evaluate(to_rpn(text, 32)))] += 1
            except Rejected as r:
                assert r.verdict in (Verdict.DIVISION_BY_ZERO, Verdict.INEXACT_DIVISION)
    return values, total


SMALL = [(1, 2, 3), (0, 5, 5), (7, 7, 7), (2, 4, 8), (3, 9, 27), (1, 1, 2), (6, 0, 0), (4, 5, 6)]


@pytest.mark.parametrize(
    "numbers",
    SMALL + [(2, 3, 4, 6), (1, 1, 5, 5), (0, 3, 3, 8)],
    ids=lambda t: "-".join(map(str, t)),
)
def test_the_solver_counts_what_brute_force_counts(numbers):
    values, total = brute_force(numbers)
    assert total == trees(len(numbers))
    assert value_counts(numbers)[-1] == dict(values)
    for target in range(-5, 40):
        assert count_solutions(numbers, target) == values[target]
        expected = any(
            sum(s * x for s, x in zip(signs, numbers)) == target
            for signs in itertools.product((1, -1), repeat=len(numbers))
            if 1 in signs
        )
        assert additive(numbers, target) == expected


def test_trees_and_the_random_sample_of_triples():
    assert [trees(n) for n in (1, 2, 3, 4)] == [1, 8, 192, 7680]
    rng = random.Random(5)
    for _ in range(25):
        numbers = tuple(rng.randint(1, 12) for _ in range(3))
        values, _ = brute_force(numbers)
        assert value_counts(numbers)[-1] == dict(values)


def test_a_drawn_solution_is_correct_and_every_solution_is_drawn():
    rng = random.Random(0)
    for p in problems(150, "train", 11):
        text = to_text(sample_solution(p.numbers, p.target, rng))
        assert check(text, p.numbers, p.target) == (Verdict.CORRECT, ""), (p.prompt, text)
    numbers, target = (2, 3, 4, 6), 50  # 8 solution trees
    n = count_solutions(numbers, target)
    drawn = Counter(repr(sample_solution(numbers, target, rng)) for _ in range(40 * n))
    assert len(drawn) == n  # distinct ordered trees; uniform: none far from 40 draws
    assert min(drawn.values()) > 15 and max(drawn.values()) < 70
    with pytest.raises(ValueError):
        sample_solution((2, 3, 4), 1000, rng)


def test_text_has_only_the_parentheses_it_needs_and_reads_back():
    cases = {
        ("*", ("+", 2, 3), 4): "(2+3)*4",
        ("+", 2, ("*", 3, 4)): "2+3*4",
        ("-", 7, ("-", 5, 1)): "7-(5-1)",
        ("-", ("-", 7, 5), 1): "7-5-1",
        ("+", 2, ("+", 3, 4)): "2+3+4",
        ("/", 8, ("/", 4, 2)): "8/(4/2)",
        ("*", 2, ("/", 6, 3)): "2*(6/3)",
        ("/", ("*", 2, 6), 3): "2*6/3",
    }
    for tree, text in cases.items():
        assert to_text(tree) == text
    rng = random.Random(1)
    for _ in range(500):
        tree = random_tree(tuple(rng.randint(0, 20) for _ in range(rng.choice((3, 4)))), rng)
        v = value(tree)
        if v is not None:
            assert evaluate(to_rpn(to_text(tree), 32)) == v, to_text(tree)


def test_problems_are_deterministic_solvable_and_in_range():
    a = problems(300, "train", 3)
    assert a == problems(300, "train", 3) and a != problems(300, "train", 4)
    assert len({p.key for p in a}) == 300
    spec = TaskSpec()
    for p in a:
        assert len(p.numbers) in spec.counts and all(1 <= x <= 50 for x in p.numbers)
        assert 1 <= p.target <= 100 and split_of(p.numbers) == "train"
        assert p.solutions == count_solutions(p.numbers, p.target) > 0
        assert p.additive == additive(p.numbers, p.target) and p.label == difficulty(p.share)
    assert Counter(len(p.numbers) for p in a)[3] in range(120, 181)
    assert heldout(40) == heldout(120)[:40] and probes(20) == probes(60)[:20]
    four = problems(50, "train", 3, TaskSpec(counts=(4,), high=20))
    assert all(len(p.numbers) == 4 and max(p.numbers) <= 20 for p in four)


def test_the_splits_never_overlap():
    held, probe = heldout(400), probes(200)
    train = problems(2000, "train", 0) + problems(2000, "train", 1)
    sets = {"heldout": held, "probe": probe, "train": train}
    for name, items in sets.items():
        assert {split_of(p.numbers) for p in items} == {name}
    numbers = {name: {p.key[0] for p in items} for name, items in sets.items()}
    assert not numbers["heldout"] & numbers["train"]
    assert not numbers["probe"] & numbers["train"]
    assert not numbers["heldout"] & numbers["probe"]
    assert split_of((50, 3, 7)) == split_of((3, 7, 50))  # the order does not matter
    rng = random.Random(2)
    shares = Counter(split_of(tuple(rng.randint(1, 99) for _ in range(4))) for _ in range(20_000))
    for name, (lo, hi) in SPLITS.items():
        assert abs(shares[name] / 20_000 - (hi - lo) / 1000) < 0.01, (name, shares)


def test_prompt_reference_and_characters():
    p = Problem((3, 7, 25, 50), 78, count_solutions((3, 7, 25, 50), 78), False)
    assert (p.prompt, p.reference) == ("3,7,25,50:78=", "3,7,25,50:78")
    assert set(p.prompt) | set("(50-25)*3+3") <= set(CHARS) and len(set(CHARS)) == len(CHARS)
    from demo.model import build_tokenizer

    tok = build_tokenizer(CHARS)
    for text in [p.prompt + "(50-25)*3+3", "1,2:3=8/(4/2)-1"]:
        ids = tok.encode(text)
        assert len(ids) == len(text) and tok.decode(ids) == text and tok.unk_token_id not in ids


def test_the_demonstrator_is_right_at_its_rate_and_wrong_plausibly():
    items = problems(600, "train", 7)
    rng = random.Random(3)
    verdicts = Counter(
        check(Demonstrator(correct=0.3).answer(p, rng), p.numbers, p.target)[0] for p in items
    )
    assert 0.24 < verdicts[Verdict.CORRECT] / 600 < 0.36
    assert set(verdicts) == {Verdict.CORRECT, Verdict.WRONG_VALUE, Verdict.REUSED_NUMBER}
    assert 0.1 < verdicts[Verdict.REUSED_NUMBER] / 600 < 0.25  # a quarter of 70%
    never_hard = Demonstrator(correct=1.0, by_label=(("hard", 0.0),))
    for p in items[:200]:
        v = check(never_hard.answer(p, rng), p.numbers, p.target)[0]
        assert (v == Verdict.CORRECT) == (p.label != "hard")
    for p in items[:100]:
        assert check(near_miss(p, rng), p.numbers, p.target)[0] == Verdict.WRONG_VALUE
        slip = reuse_slip(p, rng)
        assert slip is None or check(slip, p.numbers, p.target)[0] == Verdict.REUSED_NUMBER
    assert reuse_slip(Problem((5, 5, 5), 15, 1, True), rng) is None


def test_label_stats_and_bad_specs():
    stats = label_stats(300, seed=2)
    assert sum(stats["labels"].values()) == 300 and set(stats["labels"]) == set(LABELS)
    assert sum(sum(v.values()) for v in stats["by_count"].values()) == 300
    assert stats["by_count"]["3"]["hard"] == 0  # 3 numbers: share >= 1/192
    assert difficulty(1 / 100) == "easy" and difficulty(1 / 500) == "medium"
    assert difficulty(1 / 7680) == "hard"
    for bad in [
        dict(counts=()),
        dict(counts=(1,)),
        dict(low=5, high=4),
        dict(target_low=9, target_high=1),
    ]:
        with pytest.raises(ValueError):
            TaskSpec(**bad)
    with pytest.raises(ValueError):
        problems(5, "heldout", 0, TaskSpec(counts=(2,), low=1, high=2))
    with pytest.raises(ValueError):
        problems(5, "test")
