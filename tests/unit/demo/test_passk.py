"""pass@k (demo/passk.py): the stable product against the exact binomial ratio, edge cases,
and the sampler on a model that always answers one way."""

import random

import pytest

from demo.passk import pass_at_k, pass_at_k_reference


def test_matches_exact_binomial_on_irregular_cases():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 80)
        c = rng.randint(0, n)
        k = rng.randint(1, n)
        assert pass_at_k(n, c, k) == pytest.approx(pass_at_k_reference(n, c, k), abs=1e-12)


def test_known_values():
    assert pass_at_k(64, 0, 64) == 0.0
    assert pass_at_k(64, 1, 64) == 1.0  # k = n: any correct sample counts
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 = c / n
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    for k in range(1, 64):  # grows with k
        assert pass_at_k(64, 5, k) <= pass_at_k(64, 5, k + 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)
