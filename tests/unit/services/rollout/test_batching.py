"""services/rollout/batching.py: how many jobs to claim, which share an engine call, and how a
call's seconds are shared out — on irregular widths and settings."""

from __future__ import annotations

import pytest

from brorl.v1 import common_pb2
from services.rollout.batching import MAX_CLAIM, calls, claim_count, job_width, shares


@pytest.mark.parametrize(
    "batch_paths, candidates, expected",
    [(512, 64, 8), (512, 512, 1), (512, 1024, 1), (512, 100, 5), (512, 1, MAX_CLAIM),
     (1, 64, 1), (700, 48, 14), (512, 0, MAX_CLAIM)],
)  # fmt: skip
def test_claim_count_fills_the_batch_with_at_least_one_job(batch_paths, candidates, expected):
    assert claim_count(batch_paths, candidates) == expected


def test_claim_count_respects_its_cap():
    assert claim_count(4096, 16, most=7) == 7


def test_jobs_with_equal_settings_share_a_call_in_first_seen_order():
    settings = [
        {"n": 4, "temperature": 1.0},
        {"temperature": 1.0, "n": 4},  # the same settings, another key order
        {"n": 8, "temperature": 1.0},
        {"n": 4, "temperature": 0.7},
        {"n": 4, "temperature": 1.0, "stop": ["\n"]},
        {"n": 8, "temperature": 1.0},
        {"n": 4, "temperature": 1.0, "stop": ["\n"]},
    ]
    got = calls(settings)
    assert [members for _, members in got] == [[0, 1], [2, 5], [3], [4, 6]]
    assert [kwargs for kwargs, _ in got] == [settings[0], settings[2], settings[3], settings[4]]
    assert calls([]) == []


def test_shares_add_up_to_the_call_and_follow_the_paths():
    got = shares(3.0, [64, 128, 0, 8])
    assert got == pytest.approx([3.0 * 64 / 200, 3.0 * 128 / 200, 0.0, 3.0 * 8 / 200])
    assert sum(got) == pytest.approx(3.0)
    assert shares(2.0, [0, 0]) == [1.0, 1.0]  # nothing sampled: split evenly
    assert shares(1.0, []) == []


def test_a_jobs_width_is_the_candidates_one_engine_call_samples_for_it():
    job = common_pb2.PromptJob(sampling=common_pb2.SamplingParams(n=64))
    assert job_width(job.SerializeToString()) == 64
    job.env.address = "localhost:1"  # an environment's episodes are not sampled in a shared call
    assert job_width(job.SerializeToString()) == 0
    assert job_width(b"\xff\xff not a job") == 0
