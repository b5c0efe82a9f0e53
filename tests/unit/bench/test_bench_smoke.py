"""Benchmarks that cannot rot: every ``bench/*.py`` script runs from the repository root with no
PYTHONPATH (the Makefile exports one; it is removed here), at its smallest size, and prints
exactly one JSON object on stdout, holding the keys it documents: its module's ``KEYS`` (the
kernel benchmarks print through bench/kernel_common.py, whose ``KEYS`` they share). stdout must
be the object and nothing else (a log line there fails the run); progress goes to stderr, whose
last lines a failure shows.

The CUDA benchmarks (``bench/kernel_*.py``) run here as far as a CPU machine lets them: started as
``python -m bench.kernel_x`` and as ``python bench/kernel_x.py`` with no visible GPU, each
imports everything it needs and exits with its one-line message, not a traceback; on a GPU
machine (``-m gpu``) each runs ``--quick --no-compile`` and prints its object.

Each script's smallest size is ``SMOKE`` below. The scripts that start a vLLM engine, DeepSpeed
ranks or a whole cluster (``bench`` marker: most of their minute is the start) run at that size
in ``make bench-smoke``, not in ``make test``: the five together cost about 4 minutes, which the
suite's 20-minute budget does not hold. In ``make test`` each of them is started with ``--help``
from the root without PYTHONPATH, which runs every module-level import (all their imports but
the lazy ones inside ``main``). A new script without an entry fails
``test_every_benchmark_has_a_smoke_run_and_its_keys``.

Mutations tried, each failing here with the ImportError as the last line of stderr:
``from brorl.apps.recipe import nonexistent`` at the top of bench/e2e.py (at once, before any
cluster starts); ``from demo.model import nonexistent`` inside bench/weights.py's main();
``from kernels import group_advantages, nonexistent`` in bench/kernel_advantages.py (both forms).
Found when this test was written: bench/episodes.py printed vLLM's log lines on stdout before its
object (now kept on stderr).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ports import free_port_block

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "bench"
SLOW = (pytest.mark.slow, pytest.mark.bench)  # make bench-smoke
CLUSTER = SLOW + (pytest.mark.e2e,)


@dataclass(frozen=True)
class Smoke:
    args: tuple[str, ...]  # {model}, {tmp} and {base_port} are filled in by the test
    marks: tuple = ()
    timeout_s: float = 300


SMOKE = {
    "learner_update": Smoke(("--groups", "1", "--n", "4", "--steps", "1", "--repeats", "1")),
    "logprob_memory": Smoke(
        ("--truncated", "--bt", "16", "--batch", "4", "--vocab", "512", "--repeats", "1")
    ),
    "reward": Smoke(("--paths", "8", "--repeats", "1")),
    "weights": Smoke(("--tiny", "--steps", "1", "--latency-steps", "1", "--no-engine")),
    "onebit_adam": Smoke(("--tiny", "--updates", "2", "--warmup", "1", "--n", "2"), SLOW),
    "logp_gap": Smoke(("--model", "{model}", "--prompts", "1", "--n", "2", "--max-tokens", "2")),
    "episodes": Smoke(
        ("--n", "4", "--turns", "2", "--turn-tokens", "2", "--repeats", "1", "--gap-paths", "2"),
        SLOW,
    ),
    "load": Smoke(
        ("--clients", "2", "--seconds", "1", "--n", "2", "--max-tokens", "2", "--batch", "4"),
        CLUSTER,
    ),
    "rollout": Smoke(
        ("--models", "tiny", "--n", "16", "--max-tokens", "4", "--repeats", "1")
        + ("--roofline-sizes", "256"),
        CLUSTER,
    ),
    "e2e": Smoke(
        ("--workdir", "{tmp}/work", "--base-port", "{base_port}", "--eval-every", "2")
        + ("--rollout-seconds", "2", "--worker-seconds", "2")
        + ("run.sampling.n=16", "run.train.steps=2")
        + ("run.train.groups_per_step=1", "eval_problems=200", "train_problems=100")
        # a warm-start that answers some problems: after 5 steps every group was all wrong and
        # the run ended on the 500-group streak guard
        + ("warmstart=[--steps,300,--eval-problems,50]",),
        CLUSTER + (pytest.mark.redis,),
        timeout_s=600,
    ),
}
KERNELS = ("kernel_advantages", "kernel_logprobs", "kernel_policy_loss")


def scripts() -> set[str]:
    """The benchmarks: the modules of bench/ that run as a script (not the shared helpers)."""
    return {p.stem for p in BENCH.glob("*.py") if 'if __name__ == "__main__":' in p.read_text()}


def documented_keys(name: str) -> tuple[str, ...]:
    """``KEYS`` of bench/<name>.py, read without importing it; ``a.b``: key b inside key a."""
    module = "kernel_common" if name in KERNELS else name
    for node in ast.parse((BENCH / f"{module}.py").read_text()).body:
        names = [getattr(t, "id", "") for t in getattr(node, "targets", ())]
        if isinstance(node, ast.Assign) and "KEYS" in names:
            return ast.literal_eval(node.value)
    raise AssertionError(f"bench/{module}.py defines no KEYS (the keys its JSON object holds)")


def run(args: list[str], timeout_s: float, **env: str) -> subprocess.CompletedProcess:
    """``python args...`` in the repository root with this environment less PYTHONPATH."""
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env={**clean, **env},
        capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip


def tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def one_json_object(proc: subprocess.CompletedProcess, keys: tuple[str, ...]) -> dict:
    stderr = f"\n--- last lines of stderr ---\n{tail(proc.stderr)}"
    assert proc.returncode == 0, f"exit {proc.returncode}{stderr}"
    try:
        obj = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(
            f"stdout is not exactly one JSON object ({exc}):\n{tail(proc.stdout)}{stderr}"
        ) from None
    assert isinstance(obj, dict), f"stdout is a JSON {type(obj).__name__}, not an object"

    def has(key: str) -> bool:
        node = obj
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    missing = [k for k in keys if not has(k)]
    assert not missing, f"documented keys missing: {missing}; printed: {sorted(obj)}"
    return obj


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    """The demo's tiny Qwen2 (random weights): enough for bench/logp_gap.py's every path."""
    from demo.model import create_tiny_model

    return str(create_tiny_model(tmp_path_factory.mktemp("bench") / "tiny", seed=0))


def test_every_benchmark_has_a_smoke_run_and_its_keys():
    assert scripts() == set(SMOKE) | set(KERNELS), "give each bench/*.py script a SMOKE entry"
    for name in scripts():
        keys = documented_keys(name)
        assert keys and all(isinstance(k, str) for k in keys), name


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=smoke.marks) for name, smoke in SMOKE.items()]
)
def test_benchmark_prints_one_json_object_with_its_keys(name, request, tmp_path):
    smoke = SMOKE[name]
    fill = {"tmp": str(tmp_path), "base_port": free_port_block(11) if name == "e2e" else 0}
    if "{model}" in smoke.args:
        fill["model"] = request.getfixturevalue("tiny_model")
    args = [a.format(**fill) for a in smoke.args]
    proc = run([f"bench/{name}.py", *args], smoke.timeout_s)
    one_json_object(proc, documented_keys(name))


def test_the_learner_update_runs_at_the_realistic_shape():
    """``--shape long`` takes demo/long_shape.py's model and settings (its 24 M parameters)."""
    args = ["--shape", "long", "--groups", "1", "--n", "2", "--steps", "1", "--repeats", "1"]
    proc = run(["bench/learner_update.py", *args], 300)
    obj = one_json_object(proc, documented_keys("learner_update"))
    assert obj["shape"] == "long" and obj["autocast"] == "native"
    assert obj["parameters"] > 20e6 and obj["current"]["micro_batch_paths"] == 32


@pytest.mark.parametrize(
    "name", [n for n, smoke in SMOKE.items() if pytest.mark.bench in smoke.marks]
)
def test_a_heavy_benchmark_starts_from_the_root(name):
    proc = run([f"bench/{name}.py", "--help"], 120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, tail(proc.stderr)
    assert proc.stdout.startswith("usage:"), tail(proc.stdout)


@pytest.mark.parametrize("form", ["module", "script"])
@pytest.mark.parametrize("name", KERNELS)
def test_cuda_benchmark_imports_from_the_root_and_refuses_a_cpu_machine(name, form):
    start = ["-m", f"bench.{name}"] if form == "module" else [f"bench/{name}.py"]
    proc = run([*start, "--quick"], 120, CUDA_VISIBLE_DEVICES="")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, tail(proc.stderr)
    assert tail(proc.stderr, 1).endswith("needs a CUDA device (these benchmarks time GPU kernels)")
    assert proc.stdout == ""


@pytest.mark.gpu
@pytest.mark.parametrize("name", KERNELS)
def test_cuda_benchmark_prints_one_json_object_with_its_keys(name):
    proc = run(["-m", f"bench.{name}", "--quick", "--no-compile"], 300)
    obj = one_json_object(proc, documented_keys(name))
    assert obj["rows"], tail(proc.stderr)
