"""The GPU check's scripts (docs/gpu.md), checked where no GPU is: what scripts/gpu_wheels.sh
carries is pinned, scripts/gpu_check.sh parses and finds the gpu test modules, and
bench/learner_update.py keeps the caller's PYTHONPATH (where the check puts carried packages)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]


def carried() -> list[str]:
    text = (ROOT / "scripts" / "gpu_packages.txt").read_text()
    return [name for line in text.splitlines() for name in line.split("#")[0].split()]


def test_every_carried_package_is_pinned_in_the_lock():
    lock = (ROOT / "requirements.lock").read_text().lower()
    names = carried()
    assert "protobuf" in names and "pydantic" in names
    missing = [n for n in names if not re.search(rf"^{re.escape(n.lower())}==", lock, re.M)]
    assert missing == []
    # the machine's own CUDA builds are the ones under test: never carried
    assert not {"torch", "triton", "transformers"} & set(names)


def test_the_scripts_parse_and_find_the_gpu_modules():
    for script in ("gpu_check.sh", "gpu_wheels.sh"):
        subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], check=True)
    found = subprocess.run(
        ["grep", "-rl", "pytest.mark.gpu", "tests/unit"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    assert "tests/unit/kernels/test_gpu_kernels.py" in found
    assert "tests/unit/services/learner/model/test_policy_cuda.py" in found


def test_learner_update_keeps_the_callers_pythonpath(monkeypatch, tmp_path):
    sys.path.insert(0, str(ROOT))
    from bench import learner_update

    seen = {}

    def fake_run(cmd, cwd, env, **kw):
        seen["env"] = env
        out = {"seconds": [1.0], "compute_seconds": [1.0], "tokens": 1.0, "positions": 1.0}
        return SimpleNamespace(returncode=0, stdout=json.dumps(out), stderr="")

    monkeypatch.setattr(learner_update.subprocess, "run", fake_run)
    monkeypatch.setenv("PYTHONPATH", "/carried/site")
    args = SimpleNamespace(threads=1, groups=1, n=2, steps=1, micro_batch=2)
    learner_update.run_update(tmp_path, "model", args)
    assert seen["env"]["PYTHONPATH"].split(":") == [str(tmp_path), "/carried/site"]
