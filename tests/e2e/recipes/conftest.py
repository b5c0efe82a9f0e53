"""Running a recipe command (``brorl sweep / study / compare``) to its end."""

import subprocess
import sys

import pytest

from brorl.apps.launcher import REPO_ROOT


@pytest.fixture
def recipe_command(tmp_path):
    """Factory: recipe_command(["sweep"], port, *overrides) runs ``brorl sweep --workdir
    <tmp>/work --base-port port overrides...`` to its end, keeps its output in
    ``<tmp>/stdout.txt`` and returns it; a non-zero exit fails the test with the output's tail."""

    def run(command: list[str], base_port: int, *args: str, timeout: float = 900) -> str:
        cmd = [sys.executable, "-m", "brorl.apps.cli", *command, "--workdir",
               str(tmp_path / "work"), "--base-port", str(base_port), *args]  # fmt: skip
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
        (tmp_path / "stdout.txt").write_text(proc.stdout)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    return run
