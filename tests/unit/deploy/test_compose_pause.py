"""The compose test's pause (tests/e2e/compose/cluster.py), without an engine: runc's "unable to
freeze" (a busy container's cgroup not frozen in runc's time, thawed again) is a refusal the
scenario tries again; any other failure of `docker pause` is an error that names the command."""

from __future__ import annotations

import subprocess

import pytest

from tests.e2e.compose import cluster, engine
from tests.e2e.compose.engine import EngineError


def _docker(monkeypatch, returncode: int, stderr: str) -> list[tuple]:
    """`docker` answering with this exit code and stderr; the commands it was given."""
    calls = []

    def run(argv, **kw):
        calls.append(tuple(argv))
        return subprocess.CompletedProcess(argv, returncode, "", stderr)

    monkeypatch.setattr(engine.subprocess, "run", run)
    return calls


def test_a_frozen_container_is_paused(monkeypatch):
    calls = _docker(monkeypatch, 0, "")
    assert cluster.Compose.pause(None, "c1") is True
    assert calls == [("docker", "pause", "c1")]


def test_the_freezer_giving_up_is_a_refusal_to_try_again(monkeypatch):
    refused = "Error response from daemon: Cannot pause container c1: OCI runtime pause failed: "
    _docker(monkeypatch, 1, refused + "unable to freeze: unknown\n")
    assert cluster.Compose.pause(None, "c1") is False


def test_any_other_pause_failure_raises_with_the_command(monkeypatch):
    _docker(monkeypatch, 1, "Error response from daemon: No such container: c1\n")
    with pytest.raises(EngineError, match="(?s)docker pause c1.*No such container"):
        cluster.Compose.pause(None, "c1")
