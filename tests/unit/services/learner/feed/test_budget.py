"""The per-prompt sampling budget (services/learner/feed/budget.py): exact split, bounds, optimality
against brute force, and speed at a realistic size."""

import itertools
import math
import random
import time

import pytest

from services.learner.feed.budget import (
    allocate,
    gradient_variance,
    group_usefulness,
    pass_rate_estimate,
)


def objective(counts, rates, kind="mixed_group"):
    """What allocate maximises (the variance objective: minus the total variance)."""
    if kind == "variance":
        return -math.fsum(gradient_variance(n, p) for n, p in zip(counts, rates))
    return math.fsum(group_usefulness(n, p) for n, p in zip(counts, rates))


def test_group_usefulness_values():
    assert group_usefulness(1, 0.3) == pytest.approx(0.0)  # one path: never both outcomes
    assert group_usefulness(2, 0.5) == pytest.approx(0.5)
    assert group_usefulness(3, 0.2) == pytest.approx(1 - 0.2**3 - 0.8**3)
    assert group_usefulness(50, 0.0) == 0.0 and group_usefulness(50, 1.0) == 0.0
    for bad_n in (0, -1, 2.5):
        with pytest.raises(ValueError):
            group_usefulness(bad_n, 0.5)


def test_sums_to_budget_exactly_and_respects_bounds():
    rng = random.Random(0)
    for _ in range(50):
        k = rng.randint(1, 12)
        n_min = rng.randint(1, 8)
        n_max = n_min + rng.randint(0, 40)
        total = rng.randint(k * n_min, k * n_max)
        rates = [rng.choice([0.0, 1.0, rng.random()]) for _ in range(k)]
        counts = allocate(rates, total, n_min, n_max)
        assert len(counts) == k and sum(counts) == total
        assert all(n_min <= n <= n_max for n in counts)
        assert all(type(n) is int for n in counts)


def test_uncertain_prompts_get_more_while_the_budget_is_tight():
    # gains: p = 0.5 -> 0.5**n, p = 0.02 -> ~0.02 * 0.98**n; p = 0.5 leads while n < ~6
    counts = allocate([0.02, 0.5, 0.98, 0.3], total=18, n_min=2, n_max=128, objective="mixed_group")
    assert counts == [2, 6, 2, 8]
    assert counts[1] > counts[0] and counts[1] > counts[2]


def test_mixed_group_objective_at_wide_budgets_favours_rare_outcome_prompts():
    # Not a bug, the objective: p = 0.5 has both outcomes with prob 0.998 at 9 paths, while
    # p = 0.02 still gains from each path (0.98**89 = 0.17 chance of no success). So once the
    # uncertain prompts are saturated, paths go to the rare-success / rare-failure prompts.
    counts = allocate(
        [0.02, 0.5, 0.98, 0.3], total=200, n_min=2, n_max=128, objective="mixed_group"
    )
    assert counts == [89, 9, 89, 13]
    assert counts[0] > counts[1] and counts[2] > counts[1]


@pytest.mark.parametrize("kind", ["variance", "mixed_group"])
def test_solved_and_unsolvable_prompts_get_n_min(kind):
    counts = allocate([0.0, 0.4, 1.0, 0.7], total=100, n_min=8, n_max=64, objective=kind)
    assert counts[0] == 8 and counts[2] == 8
    assert sum(counts) == 100


@pytest.mark.parametrize("kind", ["variance", "mixed_group"])
def test_zero_gain_prompts_share_the_rest_evenly_once_others_are_full(kind):
    # the two uncertain prompts fill to n_max; the rest splits evenly over p = 0 and p = 1
    counts = allocate([0.0, 0.5, 1.0, 0.5], total=4 * 10, n_min=2, n_max=12, objective=kind)
    assert counts[1] == 12 and counts[3] == 12
    assert sorted([counts[0], counts[2]]) == [8, 8]


@pytest.mark.parametrize("kind", ["variance", "mixed_group"])
@pytest.mark.parametrize("p", [0.5, 0.1, 0.93, 0.0, 1.0])
@pytest.mark.parametrize("total", [60, 61, 67, 95])
def test_all_equal_rates_split_evenly(p, total, kind):
    counts = allocate([p] * 6, total=total, n_min=2, n_max=40, objective=kind)
    assert max(counts) - min(counts) <= 1 and sum(counts) == total


@pytest.mark.parametrize("kind", ["variance", "mixed_group"])
def test_optimal_against_brute_force_on_tiny_cases(kind):
    rng = random.Random(7)
    cases = 0
    for _ in range(300):
        n_min = rng.randint(1, 3)
        n_max = rng.randint(n_min, 6)
        total = rng.randint(3 * n_min, min(12, 3 * n_max))
        rates = [rng.choice([0.0, 1.0, 0.5, rng.random(), rng.random()]) for _ in range(3)]
        best = max(
            objective(c, rates, kind)
            for c in itertools.product(range(n_min, n_max + 1), repeat=3)
            if sum(c) == total
        )
        counts = allocate(rates, total, n_min, n_max, objective=kind)
        assert objective(counts, rates, kind) == pytest.approx(best, abs=1e-12), (rates, total)
        cases += 1
    assert cases == 300


def test_variance_objective_gives_uncertain_prompts_more_at_every_budget():
    # the default objective: p = 0.5 gets the most, p = 0.02 / 0.98 the fewest, at tight and
    # at wide budgets alike (the mixed-group objective inverts this at wide budgets, above)
    rates = [0.02, 0.5, 0.98, 0.3]
    for total in (18, 200, 2000):
        counts = allocate(rates, total=total, n_min=2, n_max=4096)
        assert sum(counts) == total
        assert counts[1] >= counts[3] > counts[0] and counts[0] == counts[2], (total, counts)


def test_variance_objective_is_neyman_allocation_without_active_bounds():
    # continuous optimum n_i = total * sigma_i / sum(sigma), sigma = sqrt(p (1 - p)); the
    # integer optimum lies within one path of it
    rng = random.Random(11)
    for _ in range(20):
        rates = [rng.uniform(0.05, 0.95) for _ in range(rng.randint(2, 9))]
        total = rng.randint(200, 3000)
        sigma = [math.sqrt(p * (1 - p)) for p in rates]
        counts = allocate(rates, total=total, n_min=1, n_max=total)
        for n, s in zip(counts, sigma):
            assert abs(n - total * s / sum(sigma)) <= 1.0, (rates, total, counts)


def test_gradient_variance_values():
    assert gradient_variance(4, 0.5) == pytest.approx(0.0625)
    assert gradient_variance(10, 0.2) == pytest.approx(0.016)
    assert gradient_variance(3, 0.0) == 0.0 and gradient_variance(3, 1.0) == 0.0
    with pytest.raises(ValueError):
        gradient_variance(0, 0.5)


def test_unknown_objective_is_rejected():
    with pytest.raises(ValueError, match="objective"):
        allocate([0.5], 4, 1, 8, objective="entropy")


def test_large_case_is_fast():
    rng = random.Random(3)
    rates = [rng.random() for _ in range(100)]
    rates[:10] = [0.0] * 5 + [1.0] * 5
    start = time.process_time()  # CPU time: a loaded machine slows the clock, not the work
    counts = allocate(rates, total=51200, n_min=16, n_max=1024)
    elapsed = time.process_time() - start
    assert sum(counts) == 51200 and all(16 <= n <= 1024 for n in counts)
    assert counts[:10] == [16] * 10
    assert elapsed < 2.0, f"allocate took {elapsed:.2f} s"


@pytest.mark.parametrize(
    "rates,total,n_min,n_max,match",
    [
        ([0.5, 0.5], 3, 2, 8, r"must lie in \[4, 16\]"),
        ([0.5, 0.5], 17, 2, 8, r"must lie in \[4, 16\]"),
        ([0.5, 1.2], 8, 2, 8, r"pass_rates\[1\] = 1.2 is outside \[0, 1\]"),
        ([-0.1, 0.5], 8, 2, 8, r"pass_rates\[0\]"),
        ([math.nan, 0.5], 8, 2, 8, r"pass_rates\[0\]"),
        ([0.5, 0.5], 8, 0, 8, "n_min must be >= 1"),
        ([0.5, 0.5], 8, 5, 4, "n_max"),
        ([0.5, 0.5], 8.5, 2, 8, "total must be an int"),
    ],
)
def test_invalid_inputs_are_rejected(rates, total, n_min, n_max, match):
    with pytest.raises(ValueError, match=match):
        allocate(rates, total, n_min, n_max)


def test_empty_prompt_list_takes_only_a_zero_budget():
    assert allocate([], 0, 1, 4) == []
    with pytest.raises(ValueError):
        allocate([], 1, 1, 4)


def test_pass_rate_estimate_is_beta_posterior_mean():
    assert pass_rate_estimate(0, 0) == 0.5  # uniform prior, no history
    assert pass_rate_estimate(3, 10) == pytest.approx(4 / 12)
    assert pass_rate_estimate(10, 10) == pytest.approx(11 / 12)  # never exactly 1
    assert pass_rate_estimate(0, 10, prior=(2.0, 8.0)) == pytest.approx(2 / 20)
    for bad in [(-1, 3), (4, 3)]:
        with pytest.raises(ValueError):
            pass_rate_estimate(*bad)
    with pytest.raises(ValueError):
        pass_rate_estimate(1, 2, prior=(0.0, 1.0))
