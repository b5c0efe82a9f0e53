"""The command line answers bad input in one line: every subcommand checks its inputs before it
starts anything, and a bad one gets exit code 2 and ONE line on stderr that names the input and
says what to do — no traceback, no process left behind, no cluster started first.

Each row runs ``python -m brorl.apps.cli ...`` as a new user would (a subprocess in the repository,
in its own session so that a run that does start something can be ended whole). Placeholders in
``{braces}`` are the paths and ports of the ``inputs`` fixture.
"""

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.ports import free_ports

REPO = Path(__file__).resolve().parents[4]
MARK = "CLI_BAD_INPUT_TEST_MARK"  # not BRORL_*: the services read those as config overrides

# id, argv, text stderr must contain (the input it names), text of the advice (what to do)
ROWS = [
    (
        "run-start-missing-config",
        "run start {tmp}/missing.yaml --learner {dead}",
        "missing.yaml",
        "path",
    ),
    ("run-start-not-yaml", "run start {not_yaml} --learner {dead}", "not_yaml.yaml", "YAML"),
    ("run-start-not-mapping", "run start {a_list} --learner {dead}", "a_list.yaml", "mapping"),
    ("run-status-unreachable", "run status r1 --learner {dead}", "{dead}", "brorl cluster"),
    ("run-watch-unreachable", "run watch r1 --learner {dead}", "{dead}", "brorl cluster"),
    ("run-stop-unreachable", "run stop r1 --learner {dead}", "{dead}", "brorl cluster"),
    ("run-checkpoint-unreachable", "run checkpoint r1 --learner {dead}", "{dead}", "brorl cluster"),
    ("generate-unreachable", "generate 1+1= --rollout {dead}", "{dead}", "brorl cluster"),
    ("score-unreachable", "score --completion 2 --reward {dead}", "{dead}", "brorl cluster"),
    ("run-status-address-without-port", "run status r1 --learner localhost", "localhost", "PORT"),
    (
        "run-status-token-file-missing",
        "run status r1 --learner {dead} --token-file {tmp}/token",
        "{tmp}/token",
        "docs/security.md",
    ),
    (
        "cluster-tls-cert-without-key",
        "cluster --model {model} {cluster} --tls-cert {a_file}",
        "tls.cert",
        "docs/security.md",
    ),
    ("eval-missing-model", "eval --model {tmp}/nowhere", "nowhere", "config.json"),
    ("eval-dir-without-config-json", "eval --model {empty}", "{empty}", "config.json"),
    ("eval-without-model", "eval --n 5", "--model", "--model"),
    (
        "warmstart-out-cannot-be-created",
        "warmstart --out {a_file}/out --steps 1",
        "a_file",
        "--out",
    ),
    (
        "warmstart-out-dir-without-config-json",
        "warmstart --out {stray} --steps 1",
        "{stray}",
        "config.json",
    ),
    ("cluster-missing-model", "cluster --model {tmp}/nowhere {cluster}", "nowhere", "config.json"),
    (
        "cluster-dir-without-config-json",
        "cluster --model {empty} {cluster}",
        "{empty}",
        "config.json",
    ),
    (
        "cluster-workdir-is-a-file",
        "cluster --model {model} {cluster} --workdir {a_file}",
        "--workdir",
        "another",
    ),
    (
        "cluster-redis-url-not-a-url",
        "cluster --model {model} {cluster} --redis-url localhost:6379",
        "--redis-url",
        "redis://",
    ),
    ("cluster-without-model", "cluster --workers 0", "--model", "--help"),
    (
        "cluster-zero-learner-ranks",
        "cluster --model {model} {cluster} --learner-ranks 0",
        "--learner-ranks 0",
        "--learner-ranks N",
    ),
    (
        "cluster-namespace-with-a-colon",
        "cluster --model {model} {cluster} --namespace a:b",
        "--namespace 'a:b'",
        "letters, digits",
    ),
    (
        "cluster-negative-threads",
        "cluster --model {model} {cluster} --threads-per-process -1",
        "--threads-per-process -1",
        "must be 0 to 1024",
    ),
    (
        "cluster-port-in-use",
        "cluster --model {model} {cluster} --learner-port {busy}",
        "--learner-port",
        "{busy}",
    ),
    (
        "cluster-ports-overlap",
        "cluster --model {model} {cluster} --workers 2 "
        "--rollout-base-port {p3} --learner-port {p3}",
        "--learner-port",
        "{p3}",
    ),
    (
        "demo-missing-config",
        "demo --config {tmp}/missing.yaml --workdir {tmp}/demo",
        "missing.yaml",
        "--config",
    ),
    (
        "demo-config-not-yaml",
        "demo --config {not_yaml} --workdir {tmp}/demo",
        "not_yaml.yaml",
        "YAML",
    ),
    (
        "demo-port-in-use",
        "demo --workdir {tmp}/demo --reward-port {busy} --learner-port {p1} "
        "--rollout-base-port {p2}",
        "--reward-port",
        "{busy}",
    ),
    (
        "demo-tooluse-env-port-in-use",
        "demo --config configs/tooluse.yaml --workdir {tmp}/demo --reward-port {p1} "
        "--learner-port {p2} --rollout-base-port {p3} --env-port {busy}",
        "--env-port",
        "{busy}",
    ),
    (
        "sweep-missing-config",
        "sweep --config {tmp}/missing.yaml --workdir {tmp}/sweep",
        "missing.yaml",
        "--config",
    ),
    (
        "sweep-port-in-use",
        "sweep --workdir {tmp}/sweep --base-port {busy}",
        "--base-port",
        "{busy}",
    ),
    (
        "study-port-in-use",
        "study broaden --workdir {tmp}/study --base-port {busy}",
        "--base-port",
        "{busy}",
    ),
    (
        "study-bad-setting",
        "study broaden --workdir {tmp}/study small_n=1",
        "small_n",
        "greater than or equal to 2",
    ),
    (
        "rm-train-missing-data",
        "rm train --data {tmp}/prefs.jsonl --out {tmp}/rm",
        "prefs.jsonl",
        "--generate",
    ),
    (
        "rm-train-missing-backbone",
        "rm train --generate 20 --data {tmp}/p.jsonl --out {tmp}/rm --backbone {empty}",
        "{empty}",
        "config.json",
    ),
    ("report-missing-run-dir", "report {tmp}/nowhere", "nowhere", "metrics.jsonl"),
    ("report-dir-without-metrics", "report {empty}", "{empty}", "metrics.jsonl"),
]


@pytest.fixture
def inputs(tmp_path):
    """Fresh paths per row, so that what one row's command wrote cannot pass or fail another."""
    tmp = tmp_path
    (tmp / "empty").mkdir()
    (tmp / "stray").mkdir()
    (tmp / "stray" / "notes.txt").write_text("not a model\n")
    (tmp / "model").mkdir()  # passes the model check: the port rows get past it
    (tmp / "model" / "config.json").write_text("{}\n")
    (tmp / "not_yaml.yaml").write_text("run: [1, 2\n  steps: : :\n")
    (tmp / "a_list.yaml").write_text("- 1\n- 2\n")
    (tmp / "a_file").write_text("a file, not a directory\n")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    ports = free_ports(4)  # distinct: bound one after another, two could be the same port
    values = {
        "tmp": str(tmp),
        "empty": str(tmp / "empty"),
        "stray": str(tmp / "stray"),
        "model": str(tmp / "model"),
        "not_yaml": str(tmp / "not_yaml.yaml"),
        "a_list": str(tmp / "a_list.yaml"),
        "a_file": str(tmp / "a_file"),
        "busy": str(busy.getsockname()[1]),
        "dead": f"127.0.0.1:{ports[0]}",  # nothing listens there
        "p1": str(ports[1]),
        "p2": str(ports[2]),
        "p3": str(ports[3]),
    }
    values["cluster"] = (
        f"--workdir {tmp}/cluster --workers 1 --redis-url redis://127.0.0.1:6379/0 "
        f"--reward-port {ports[1]} --learner-port {ports[2]} --rollout-base-port {ports[3]}"
    )
    yield values
    busy.close()


def marked_processes(mark: str) -> list[psutil.Process]:
    """Processes started by the command under test (they inherit its environment's mark)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARK) == mark:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


@pytest.mark.parametrize("argv,names,advice", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_gets_one_line_and_exit_2(inputs, argv, names, advice):
    # later flags win in argparse: the row's own --learner-port etc. override {cluster}'s
    args = argv.format(**inputs).split()
    names, advice = names.format(**inputs), advice.format(**inputs)
    mark = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": str(REPO), MARK: mark}
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "brorl.apps.cli", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    elapsed = time.monotonic() - started
    left = marked_processes(mark)
    for p in left:  # whatever the command started must not outlive this test
        p.kill()
    lines = err.strip().splitlines()
    assert "Traceback" not in out + err, err[-2000:]
    assert proc.returncode == 2, f"exit {proc.returncode}: {err[-2000:]}"
    assert len(lines) == 1 and lines[0].strip(), f"{len(lines)} lines on stderr:\n{err[-2000:]}"
    assert names in lines[0], lines[0]
    assert advice in lines[0], lines[0]
    assert elapsed < 20, f"took {elapsed:.1f}s"
    assert not left, f"left running: {[p.cmdline() for p in left]}"
    # the launcher opens <workdir>/logs/<name>.log before it starts any process
    assert not list(Path(inputs["tmp"]).rglob("logs")), "a cluster process was started"


def test_every_subcommand_has_its_checks():
    """A new subcommand without an entry in brorl.apps.checks fails here, not in a user's hands."""
    from brorl.apps import checks, cli

    parser = cli.build_parser()
    commands = set(parser._subparsers._group_actions[0].choices)
    assert commands == set(checks.PREFLIGHT), commands ^ set(checks.PREFLIGHT)
