"""Per-prompt sampling budget: split a step's paths across prompts by their pass rate
(pure Python, no torch).

Why: with a fixed total budget per step, paths spent on prompts the policy always (p ~ 1) or
never (p ~ 0) solves carry almost no learning signal; an uncertain prompt (p ~ 0.5) uses them.
``allocate`` solves max sum_i f(n_i, p_i) s.t. sum_i n_i = total, n_min <= n_i <= n_max for one
of two objectives f (``objective=``):

``"variance"`` (the default): f(n, p) = -p (1 - p) / n, i.e. minimise the variance of the
step's policy-gradient estimate. For a 0/1 reward, prompt i's gradient estimate from n_i paths,
(1/n_i) sum_j (r_j - p_i) grad log pi(y_j), has variance ~ p_i (1 - p_i) c / n_i (c the mean
squared score norm, taken equal across prompts); prompts are sampled independently, so the
step's variance is the sum. Its continuous optimum is Neyman allocation,
n_i ~ sqrt(p_i (1 - p_i)): p = 0.5 gets 3.6x the paths of p = 0.02 or 0.98 at *every* budget,
and p in {0, 1} gets n_min. This is what the per-prompt budget is for ("prompts near 0 or 1 get
few paths, uncertain ones many").

``"mixed_group"``: f(n, p) = u(n, p) = 1 - p**n - (1 - p)**n, the probability that the group has
a success and a failure (a non-zero advantage). Kept for comparison, because it misbehaves at
BroRL's widths: its gain p**n (1-p) + (1-p)**n p is ~0.5**n at p = 0.5 but ~0.02 * 0.98**n at
p = 0.02, so p = 0.5 saturates at ~9 paths (u = 0.998) and every further path goes to the
rare-success / rare-failure prompts (200 paths over p = 0.02, 0.5, 0.98, 0.3 give 89, 9, 89,
13). It counts whether a group has *any* signal, not how much; at wide budgets nearly every
group has some, and the objective then spends the budget on the weakest ones.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence


def group_usefulness(n: int, p: float) -> float:
    """u(n, p) = 1 - p**n - (1-p)**n: probability that n independent paths with pass rate p
    contain both a success and a failure (the group has a non-zero advantage). n >= 1 only: at
    n = 0 the formula gives -1, which is not a probability, and (with u(0) := 0) u would not be
    concave, which ``allocate``'s greedy needs; a group of 0 paths is not a group anyway."""
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    _check_p(0, p)
    return 1.0 - p**n - (1.0 - p) ** n


def _check_p(i: int, p: float) -> None:
    if not 0.0 <= p <= 1.0:  # also rejects NaN
        raise ValueError(f"pass_rates[{i}] = {p!r} is outside [0, 1]")


def gradient_variance(n: int, p: float) -> float:
    """p (1 - p) / n: the variance (in units of the mean squared score norm) of the gradient
    estimate of a prompt with pass rate p from n paths (module docstring); n >= 1."""
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    _check_p(0, p)
    return p * (1.0 - p) / n


OBJECTIVES = ("variance", "mixed_group")


def _log_gain_variance(n: int, p: float) -> float:
    """log of the variance removed by path n+1: p(1-p) (1/n - 1/(n+1)) = p(1-p) / (n (n+1));
    -inf for p in {0, 1}. Falls with n, so the objective is concave."""
    if p <= 0.0 or p >= 1.0:
        return -math.inf
    return math.log(p) + math.log1p(-p) - math.log(n) - math.log(n + 1)


def _log_gain(n: int, p: float) -> float:
    """log(u(n+1, p) - u(n, p)) for n >= 1; -inf when the gain is 0 (p in {0, 1}).

    u(n+1) - u(n) = p**n (1-p) + (1-p)**n p. In log space so that gains far below the
    smallest float (p = 0.5, n = 1100 gives 2**-1100) still rank correctly instead of
    underflowing to a tie with a p = 0 prompt."""
    if p <= 0.0 or p >= 1.0:
        return -math.inf
    a = n * math.log(p) + math.log1p(-p)
    b = n * math.log1p(-p) + math.log(p)
    hi, lo = (a, b) if a >= b else (b, a)
    return hi + math.log1p(math.exp(lo - hi))


def allocate(
    pass_rates: Sequence[float],
    total: int,
    n_min: int,
    n_max: int,
    objective: str = "variance",
) -> list[int]:
    """Paths per prompt (len = len(pass_rates), sum = total, each in [n_min, n_max]) that
    optimise ``objective`` (module docstring): "variance" minimises
    sum_i gradient_variance(n_i, p_i), "mixed_group" maximises sum_i group_usefulness(n_i, p_i).

    Greedy: start every prompt at n_min, then hand out the remaining paths one at a time, each
    to the prompt whose next path improves the objective most; ties go to
    the prompt with fewer paths so far, then the lower index (so prompts of equal or zero
    gain, e.g. p = 0 or 1 once the others are full, split the rest evenly).

    Why greedy is optimal (exact, not a heuristic): the objective is a sum of one-variable
    functions, and each is concave in n for n >= 1: its gain (p(1-p) / (n (n+1)), or
    p**n (1-p) + (1-p)**n p) never grows with n. So prompt i's gains form a non-increasing
    list, and any feasible allocation earns sum_i f(n_min, p_i) plus the first
    (n_i - n_min) gains of each list. The best allocation therefore takes the
    (total - len * n_min) largest gains of all lists together (taking a list's first k is
    never worse than any k of its gains, because the list is sorted); greedy takes exactly
    those, one largest remaining gain at a time. Each step is a heap pop/push:
    O((total - len * n_min) log len), ~0.1 s for 50k paths over 100 prompts.
    Gains are compared in log space; equal up to float64 rounding is a tie.

    pass_rates: estimated pass rate per prompt, each in [0, 1] (``pass_rate_estimate`` for
    prompts with history). total: the step's path budget. n_min >= 1, n_max >= n_min: paths
    per prompt. Raises ValueError when the bounds cannot be met or an input is invalid."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    log_gain = _log_gain_variance if objective == "variance" else _log_gain
    rates, total, n_min, n_max = _checked(pass_rates, total, n_min, n_max)
    k = len(rates)
    counts = [n_min] * k  # paths per prompt so far
    # heap entries: (-log gain of the next path, paths so far, index) -> largest gain first
    heap = [(-log_gain(n_min, p), n_min, i) for i, p in enumerate(rates) if n_min < n_max]
    heapq.heapify(heap)
    for _ in range(total - k * n_min):
        _, n, i = heapq.heappop(heap)
        n += 1
        counts[i] = n
        if n < n_max:
            heapq.heappush(heap, (-log_gain(n, rates[i]), n, i))
    return counts


def _checked(pass_rates, total, n_min, n_max) -> tuple[list[float], int, int, int]:
    """allocate's inputs as floats and ints; ValueError naming what cannot be met."""
    rates = [float(p) for p in pass_rates]
    for i, p in enumerate(rates):
        _check_p(i, p)
    for name, value in (("total", total), ("n_min", n_min), ("n_max", n_max)):
        if isinstance(value, bool) or int(value) != value:
            raise ValueError(f"{name} must be an int, got {value!r}")
    total, n_min, n_max = int(total), int(n_min), int(n_max)
    if n_min < 1:
        raise ValueError(f"n_min must be >= 1 (a group needs a path), got {n_min}")
    if n_max < n_min:
        raise ValueError(f"n_max ({n_max}) must be >= n_min ({n_min})")
    k = len(rates)
    if not k * n_min <= total <= k * n_max:
        raise ValueError(
            f"total = {total} paths cannot be split over {k} prompts with {n_min} <= n <= "
            f"{n_max} each: it must lie in [{k * n_min}, {k * n_max}]"
        )
    return rates, total, n_min, n_max


def pass_rate_estimate(
    successes: int, trials: int, prior: tuple[float, float] = (1.0, 1.0)
) -> float:
    """Posterior mean of a prompt's pass rate under a Beta(a, b) prior: (a + s) / (a + b + t).

    Why not s / t: with little history the raw rate is 0 or 1, which ``allocate`` reads as
    "no signal possible" and starves the prompt at n_min; the prior (default uniform, 0.5 with
    no trials) keeps it in (0, 1). successes, trials: counts of passing paths and all paths."""
    a, b = prior
    if not (a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b)):
        raise ValueError(f"prior must be two finite numbers > 0, got {prior!r}")
    if not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes} of {trials}")
    return (a + successes) / (a + b + trials)
