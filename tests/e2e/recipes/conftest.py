"""Running a recipe command (``brorl sweep / study / compare``) to its end."""

import shutil
import subprocess
import sys

import pytest

from brorl.apps.cluster.launcher import REPO_ROOT, child_env
from tests.ports import free_port_block

# The shortened warm-start every recipe test trains on (its `warmstart=` override): trained once
# per session (recipe_warmstart) and copied into each test's workdir, where the recipe finds it
# cached under its config hash (demo/warmstart.py) instead of training it again. One torch
# thread: the suite's other lane keeps a core busy, and two threads then take twice as long
# (this warm-start beside one busy core: 38.6 s at two threads, 19.8 s at one; 13.4 and 15.8 s
# on idle cores).
WARMSTART = ["--steps", "150", "--eval-problems", "50"]
WARMSTART_OVERRIDE = "[" + ",".join(WARMSTART) + "]"


@pytest.fixture(scope="session")
def recipe_warmstart(tmp_path_factory):
    out = tmp_path_factory.mktemp("recipe_warmstart") / "warmstart"
    cmd = [sys.executable, "-m", "demo", "warmstart", "--out", str(out), *WARMSTART]
    proc = subprocess.run(
        cmd, cwd=REPO_ROOT, env=child_env(threads=1), capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out


@pytest.fixture
def recipe_command(tmp_path, recipe_warmstart):
    """Factory: recipe_command(["sweep"], *overrides) runs ``brorl sweep --workdir
    <tmp>/work --base-port <free> overrides...`` to its end, keeps its output in
    ``<tmp>/stdout.txt`` and returns it; a non-zero exit fails the test with the output's tail.
    The workdir starts with the session's WARMSTART model in place."""

    def run(command: list[str], *args: str, timeout: float = 900) -> str:
        base_port = free_port_block()
        shutil.copytree(recipe_warmstart, tmp_path / "work" / "warmstart")
        cmd = [sys.executable, "-m", "brorl.apps.cli", *command, "--workdir",
               str(tmp_path / "work"), "--base-port", str(base_port), *args]  # fmt: skip
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
        (tmp_path / "stdout.txt").write_text(proc.stdout)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    return run
