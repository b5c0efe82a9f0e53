"""A run whose references are worked solutions (GSM8K's "#### x"), through the real cluster: the run
config sets ``reward_fn: "math_answer:reference_kind=solution"``, the reward service (default
config) builds that variant, and every path is scored against the answer read out of its
reference — no path is left out for a reward error, and each sample's reward is the one its
completion and reference call for (examples/math_solutions/README.md)."""

import json
import re
import shutil
import uuid

import pytest

from brorl.apps.cluster.launcher import REPO_ROOT
from brorl.client import LearnerClient

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.redis]

DATA = REPO_ROOT / "examples" / "math_solutions" / "gsm8k_addition.jsonl"


def config(model, data) -> str:
    return f"""
model: {model}
data: {{train_path: {data}}}
reward_fn: "math_answer:reference_kind=solution"
sampling: {{n: 16, temperature: 1.0, top_k: -1, top_p: 1.0, max_tokens: 6}}
train: {{steps: 2, groups_per_step: 2, lr: 0.001}}
async: {{max_staleness: 2, max_inflight_groups: 4}}
checkpoint_every: 0
samples_every: 1
"""


def expected_reward(text: str, reference: str) -> float | None:
    """1/0 for a completion that is a bare integer; None for anything else (the verifier's own
    tests cover those)."""
    answer = re.search(r"^####\s*(\S+)", reference, re.MULTILINE).group(1)
    if not re.fullmatch(r"\s*-?\d+\s*", text):
        return None
    return float(int(text) == int(answer))


def test_solution_references_through_the_cluster(shared_cluster, tmp_path):
    data = shutil.copy(DATA, tmp_path / DATA.name)  # under the cluster's read_roots
    client = LearnerClient(shared_cluster["procs"]["learner"].address)
    run_id = f"sol-{uuid.uuid4().hex[:6]}"
    info = client.start(config(shared_cluster["model"], data), run_id=run_id)
    list(client.watch(info.run_id, timeout=600))
    final = client.get(info.run_id)
    assert final.state == "finished" and final.step == 2, final.message
    run_dir = shared_cluster["runs"] / info.run_id
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "learner/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert not any(k.startswith("learner/excluded_paths/") and v for k, v in r.items()), r
        assert 0.0 <= r["reward/mean"] <= 1.0
    lines = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    samples = [s for line in lines for s in line["samples"]]
    assert [line["step"] for line in lines] == [1, 2] and len(samples) == 6
    for s in samples:
        assert "####" in s["reference"] and s["reward"] in (0.0, 1.0)
        want = expected_reward(s["text"], s["reference"])
        assert want is None or s["reward"] == want, s
