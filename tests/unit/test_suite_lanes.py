"""scripts/test.sh (make test) runs the suite as lanes of pytest commands side by side. Run here
with a stand-in for python that records each pytest command and answers with a chosen exit
code: every test file lands in exactly one command, and any command's failure, exit code 5
(nothing collected) included, fails the suite."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE = """#!/usr/bin/env bash
line=$(printf '%q ' "$@")
echo "$line" >> "$RECORD"  # one write: the lanes append at once, and two writes could interleave
case "$*" in *"$FAIL_ON"*) [ -n "$FAIL_ON" ] && exit "$FAIL_CODE" ;; esac
exit 0
"""


def run_suite(tmp_path: Path, fail_on: str = "", code: int = 0) -> tuple[int, list[list[str]]]:
    fake = tmp_path / "python"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    record = tmp_path / "record"
    record.write_text("")
    env = {**os.environ, "PY": str(fake), "RECORD": str(record), "FAIL_ON": fail_on,
           "FAIL_CODE": str(code)}  # fmt: skip
    proc = subprocess.run(
        ["bash", "scripts/test.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    return proc.returncode, [shlex.split(line) for line in record.read_text().splitlines()]


COMPOSE = ROOT / "tests/e2e/test_compose.py"  # every test of it is marked docker


def selected(args: list[str]) -> set[Path]:
    """The test files one pytest command runs: its paths, less its --ignore'd ones (and the
    compose test's file where the command's marker leaves out docker)."""
    paths = [ROOT / a for a in args if a.startswith("tests/")]
    ignored = [ROOT / a.split("=", 1)[1] for a in args if a.startswith("--ignore=")]
    if "not docker" in args[args.index("-m", 2) + 1]:
        ignored.append(COMPOSE)
    out = set()
    for p in paths:
        files = [p] if p.is_file() else p.rglob("test_*.py")
        out |= {f for f in files if not any(f == i or i in f.parents for i in ignored)}
    return out


def test_every_test_file_runs_in_exactly_one_command(tmp_path):
    rc, commands = run_suite(tmp_path)
    assert rc == 0
    assert all(c[:2] == ["-m", "pytest"] for c in commands) and len(commands) == 3
    seen: dict[Path, int] = {}
    for command in commands:
        for f in selected(command):
            seen[f] = seen.get(f, 0) + 1
    every = set((ROOT / "tests").rglob("test_*.py"))
    assert set(seen) == every, sorted(str(f) for f in every ^ set(seen))
    assert {f for f, n in seen.items() if n > 1} == set()
    compose = [c for c in commands if COMPOSE in selected(c)]
    assert len(compose) == 1 and compose[0][compose[0].index("-m", 2) + 1] == "docker"


@pytest.mark.parametrize("fail_on", ["tests/unit", "tests/integration", "tests/e2e/recipes",
                                     "test_compose.py", "--ignore=tests/e2e/recipes"])  # fmt: skip
@pytest.mark.parametrize("code", [1, 5])
def test_a_failing_or_empty_command_fails_the_suite(tmp_path, fail_on, code):
    rc, commands = run_suite(tmp_path, fail_on, code)
    assert rc != 0
    assert len(commands) == 3  # the lane goes on: the other commands still run
