"""sampling.budget and probe in the run config, and job_parts with a per-group n."""

import pytest

from brorl import sampling
from brorl.config.base import validate
from brorl.errors import InvalidArgument
from brorl.config.run import RunConfig


def config(**sections):
    return validate(RunConfig, {"model": "m", "data": {"train_path": "t.jsonl"}, **sections})


def test_default_budget_is_uniform_and_probe_off():
    cfg = config()
    assert cfg.sampling.budget.kind == "uniform" and cfg.probe is None


def test_adaptive_budget_must_fit_the_step():
    cfg = config(
        sampling={"budget": {"kind": "adaptive", "total": 40, "n_min": 4, "n_max": 16}},
        train={"groups_per_step": 4},
    )
    assert cfg.sampling.budget.objective == "variance"
    with pytest.raises(InvalidArgument, match=r"sampling.budget.total = 70 .* \[16, 64\]"):
        config(
            sampling={"budget": {"kind": "adaptive", "total": 70, "n_min": 4, "n_max": 16}},
            train={"groups_per_step": 4},
        )
    with pytest.raises(InvalidArgument, match="n_max"):
        config(sampling={"budget": {"kind": "adaptive", "total": 8, "n_min": 9, "n_max": 4}})
    with pytest.raises(InvalidArgument, match="sampling.budget"):
        config(sampling={"budget": {"kind": "greedy", "total": 8}})


def test_probe_section():
    assert config(probe={"path": "p.jsonl"}).probe.every == 1
    with pytest.raises(InvalidArgument, match="probe.every"):
        config(probe={"path": "p.jsonl", "every": 0})


def test_job_parts_follow_the_groups_own_n():
    cfg = config(sampling={"n": 8, "max_paths_per_job": 5}, explore={"oversample_m": 16})
    parts = sampling.job_parts(cfg.sampling, cfg.explore, step=0, n=12)
    assert [p.sampling.n for p in parts] == [5, 5, 2]
    assert [p.path_offset for p in parts] == [0, 5, 10] and {p.count for p in parts} == {3}
    assert [p.explore.oversample_m for p in parts] == [7, 7, 3]  # shares of M = 16 over 12
    [one] = sampling.job_parts(cfg.sampling, cfg.explore, step=0, n=3)
    assert one.sampling.n == 3 and one.count == 1
    assert [p.sampling.n for p in sampling.job_parts(cfg.sampling, cfg.explore, 0)] == [5, 3]
    with pytest.raises(ValueError):
        sampling.job_parts(cfg.sampling, cfg.explore, step=0, n=0)
