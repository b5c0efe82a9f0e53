"""Training on a subset of each group (services/learner/algo/downsample.py): the max-variance
subset against every subset, the tie order, the copies of the groups, and the config's bounds."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from brorl.config.train import TrainConfig
from brorl.v1 import common_pb2
from services.learner.algo.downsample import (
    keep_paths,
    max_variance_reference,
    max_variance_subset,
    random_subset,
)


def variance(x) -> float:
    return float(np.var(np.asarray(x, dtype=np.float64)))


@pytest.mark.parametrize("kind", ["continuous", "binary", "few_levels", "outliers"])
def test_the_subset_has_the_largest_variance_of_any_subset(kind):
    rng = np.random.default_rng(7)
    for trial in range(60):
        n = int(rng.integers(2, 10))
        m = int(rng.integers(1, n + 1))
        if kind == "continuous":
            r = rng.normal(size=n)
        elif kind == "binary":
            r = (rng.random(n) < rng.random()).astype(float)
        elif kind == "few_levels":
            r = rng.integers(0, 3, size=n) * 0.5
        else:
            r = np.where(rng.random(n) < 0.2, rng.normal(scale=100, size=n), rng.normal(size=n))
        kept = max_variance_subset(r, m, np.random.default_rng(trial))
        assert kept.shape == (m,) and len(set(kept.tolist())) == m
        assert list(kept) == sorted(kept) and (0 <= kept).all() and (kept < n).all()
        best = max_variance_reference(r.tolist(), m)
        assert variance(r[kept]) == pytest.approx(best, rel=1e-9, abs=1e-12), (r, m)


def test_right_and_wrong_paths_are_balanced_as_far_as_the_group_allows():
    r = np.array([1, 0, 0, 1, 0, 0, 0, 1, 0, 0], dtype=float)  # 3 right of 10
    assert sorted(r[max_variance_subset(r, 4)]) == [0, 0, 1, 1]
    assert sorted(r[max_variance_subset(r, 8)]) == [0, 0, 0, 0, 0, 1, 1, 1]
    one = np.array([0, 0, 1, 0, 0, 0], dtype=float)
    assert sorted(one[max_variance_subset(one, 4)]) == [0, 0, 0, 1]


def test_equal_rewards_are_taken_in_the_random_order():
    """Which of equally rewarded paths are kept follows the generator, not the paths' order:
    over many draws every wrong path is kept about equally often."""
    r = np.array([1.0] * 3 + [0.0] * 7)
    counts = np.zeros(10)
    draws = 2000
    rng = np.random.default_rng(0)
    for _ in range(draws):
        counts[max_variance_subset(r, 4, rng)] += 1
    wrong = counts[3:] / draws  # each of the 7 wrong paths: 2 of 7 kept
    assert np.allclose(wrong, 2 / 7, atol=0.04), wrong
    assert np.allclose(counts[:3] / draws, 2 / 3, atol=0.04)


def test_all_and_none_and_too_many():
    r = np.array([0.3, 0.1, 0.2])
    assert max_variance_subset(r, 3).tolist() == [0, 1, 2]
    assert max_variance_subset(r, 0).tolist() == []
    with pytest.raises(ValueError, match="cannot keep 4 of 3"):
        max_variance_subset(r, 4)
    with pytest.raises(ValueError, match="cannot keep 4 of 3"):
        random_subset(3, 4, np.random.default_rng(0))


def test_random_subset_is_uniform():
    rng = np.random.default_rng(1)
    counts = np.zeros(6)
    for _ in range(3000):
        kept = random_subset(6, 2, rng)
        assert kept.shape == (2,) and kept[0] < kept[1]
        counts[kept] += 1
    assert np.allclose(counts / 3000, 1 / 3, atol=0.04), counts


def group(group_id: str, rewards: list[float]) -> common_pb2.PathGroup:
    g = common_pb2.PathGroup(group_id=group_id, prompt_id="p", prompt_token_ids=[3, 4, 5])
    for i, r in enumerate(rewards):
        g.paths.add(path_id=f"{group_id}/{i}", token_ids=[7] * (i + 1), reward=r)
    return g


def test_keep_paths_copies_the_longer_groups_and_keeps_the_paths_order():
    wide = group("a", [0.0, 1.0, 0.5, 0.0, 1.0, 0.2, 0.9, 0.1])
    narrow = group("b", [1.0, 0.0])
    train = TrainConfig(keep_paths=4)
    out = keep_paths([wide, narrow], train, step=3)
    assert out[1] is narrow  # at most m paths: kept whole, not copied
    short = out[0]
    assert len(wide.paths) == 8  # the group given is not changed
    assert short.group_id == "a" and list(short.prompt_token_ids) == [3, 4, 5]
    ids = [int(p.path_id.split("/")[1]) for p in short.paths]
    assert ids == sorted(ids) and len(ids) == 4
    assert sorted(p.reward for p in short.paths) == [0.0, 0.0, 1.0, 1.0]
    assert [len(p.token_ids) for p in short.paths] == [i + 1 for i in ids]  # whole paths


def test_keep_paths_draws_from_the_seed_and_step():
    wide = group("a", [0.0] * 10)
    train = TrainConfig(keep_paths=3, keep_rule="random", seed=-5)

    def ids(step, cfg=train):
        return [p.path_id for p in keep_paths([wide], cfg, step)[0].paths]

    assert ids(1) == ids(1)  # a resumed run keeps the same paths
    assert len({tuple(ids(s)) for s in range(8)}) > 1
    other = TrainConfig(keep_paths=3, keep_rule="random", seed=6)
    assert any(ids(s) != ids(s, other) for s in range(4))
    assert keep_paths([wide], TrainConfig(), 1)[0] is wide  # keep_paths 0: every path


def test_the_config_refuses_a_group_of_one_and_unknown_rules():
    with pytest.raises(ValidationError, match="keep_paths 1 leaves a group of one path"):
        TrainConfig(keep_paths=1)
    with pytest.raises(ValidationError):
        TrainConfig(keep_paths=4, keep_rule="top")
    with pytest.raises(ValidationError):
        TrainConfig(keep_paths=-1)


def run_config(sampling: dict, keep: int):
    from brorl.config.run import RunConfig

    train = {"groups_per_step": 2, "keep_paths": keep}
    base = {"model": "/m", "data": {"train_path": "/d.jsonl"}, "train": train}
    return RunConfig.model_validate({**base, "sampling": sampling})


def test_a_run_refuses_a_keep_that_keeps_every_path():
    """keep_paths at or over the widest group would silently train on every path."""
    assert run_config({"n": 8}, 4).train.keep_paths == 4
    for keep in (8, 12):
        with pytest.raises(ValidationError, match=f"train.keep_paths = {keep} keeps every path"):
            run_config({"n": 8}, keep)
    # an adaptive budget widens some groups past sampling.n: a keep below its n_max cuts those
    adaptive = {"n": 8, "budget": {"kind": "adaptive", "total": 16, "n_min": 2, "n_max": 14}}
    assert run_config(adaptive, 12).train.keep_paths == 12
    with pytest.raises(ValidationError, match="at most 14"):
        run_config(adaptive, 14)
