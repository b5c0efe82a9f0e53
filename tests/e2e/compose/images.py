"""The images the compose test runs, built without a registry: a Python 3.11 base from Debian 12's
packages (mmdebstrap + docker import), Redis from Debian's redis-server on that base, and brorl's
cpu image from docker/Dockerfile with the host's extra CA certificates and torch wheel in its
git-ignored context folders.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import http.server
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from tests.e2e.compose.engine import EngineError, sh

REPO = Path(__file__).resolve().parents[3]
BASE_IMAGE = "brorl-local/python:3.11-bookworm"
REDIS_IMAGE = "brorl-local/redis:bookworm"
CPU_IMAGE = "brorl:cpu"
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
WHEELS_PORT = 47163  # where the build finds the host's torch wheel (served_wheels)
# What the base needs beyond minbase: the lock's Python (bookworm's python3 is 3.11) with venv and
# its C headers (DeepSpeed JIT-builds its CPU ops against Python.h when a run starts).
BASE_PACKAGES = "python3,python3-venv,python3-pip,python3-dev,ca-certificates"


def image_exists(tag: str) -> bool:
    return sh("docker", "image", "inspect", tag, check=False).returncode == 0


def build_base(suite: str = "bookworm") -> float:
    """The local base image, made once per data root; seconds spent (0 when it was there)."""
    if image_exists(BASE_IMAGE):
        return 0.0
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "rootfs.tar"
        sh("mmdebstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", suite, str(tar))
        sh("docker", "import", "-c", 'CMD ["python3"]', str(tar), BASE_IMAGE)
    return time.monotonic() - t0


def _pip_find_links() -> list[str]:
    """The find-links folders of this host's pip configuration (files and PIP_FIND_LINKS)."""
    out = sh("python3", "-m", "pip", "config", "list", check=False).stdout
    values = re.findall(r"find-links='([^']*)'", out) + [os.environ.get("PIP_FIND_LINKS", "")]
    return [d for v in values for d in v.split() if d and Path(d).is_dir()]


def _locked(package: str) -> str:
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if line.startswith(f"{package}=="):
            return line.split("==", 1)[1].strip()
    raise EngineError(f"requirements.lock pins no {package}")


def fill_ca_certificates() -> int:
    """Copy the host's extra CA certificates into docker/ca-certificates/ (git-ignored), leaving
    files already there as they are (the build's layer cache keys on them); how many."""
    ca_dir = REPO / "docker" / "ca-certificates"
    want = {c.name: c for c in HOST_CA_DIR.glob("**/*.crt")}
    for old in ca_dir.iterdir():
        if old.name != ".gitignore" and old.name not in want:
            old.unlink()
    for name, src in want.items():
        dest = ca_dir / name
        if not dest.exists() or dest.read_bytes() != src.read_bytes():
            shutil.copy2(src, dest)
    return len(want)


def torch_wheel() -> Path | None:
    """The lock's torch wheel where this host's pip finds it (find-links), if it is there."""
    version = _locked("torch")
    for folder in _pip_find_links():
        found = glob.glob(os.path.join(folder, f"torch-{glob.escape(version)}-cp311-*.whl"))
        if found:
            return Path(found[0])
    return None


@contextlib.contextmanager
def served_wheels(wheels: list[Path]):
    """An HTTP directory listing of ``wheels`` on the default bridge's gateway address, which
    build containers reach; yields its URL (None without wheels)."""
    if not wheels:
        yield None
        return
    gateway = bridge_address()
    with tempfile.TemporaryDirectory() as tmp:
        for w in wheels:
            (Path(tmp) / w.name).symlink_to(w)
        handler = functools.partial(_QuietHandler, directory=tmp)
        try:  # a fixed port: the URL is a build argument, part of the layer cache's key
            server = http.server.ThreadingHTTPServer((gateway, WHEELS_PORT), handler)
        except OSError:
            server = http.server.ThreadingHTTPServer((gateway, 0), handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://{gateway}:{server.server_address[1]}/"
        finally:
            server.shutdown()
            server.server_close()


def bridge_address() -> str:
    """The host's address on the engine's default bridge (docker0's), which containers reach."""
    name = (
        sh(
            "docker",
            "network",
            "inspect",
            "bridge",
            "--format",
            '{{index .Options "com.docker.network.bridge.name"}}',
        ).stdout.strip()
        or "docker0"
    )
    out = sh("ip", "-4", "-o", "addr", "show", "dev", name).stdout.split()
    if "inet" not in out:
        raise EngineError(f"the bridge {name} has no IPv4 address")
    return out[out.index("inet") + 1].split("/")[0]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def docker_build(tag: str, dockerfile: str, target: str | None = None, **args: str) -> float:
    """`docker build` of the repository (legacy builder: the 20.10 engine without buildx);
    seconds taken. A failure shows the build's last lines."""
    argv = ["docker", "build", "-f", dockerfile, "-t", tag]
    if target:
        argv += ["--target", target]
    for key, value in args.items():
        argv += ["--build-arg", f"{key}={value}"]
    t0 = time.monotonic()
    proc = subprocess.run(
        [*argv, "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        raise EngineError(f"building {tag} ({dockerfile}, target {target}) failed:\n{tail}")
    return time.monotonic() - t0


def build_all() -> dict[str, float]:
    """Base, Redis and the cpu image; seconds per phase (cached layers make a warm build fast)."""
    times = {"base": build_base()}
    fill_ca_certificates()
    times["redis"] = docker_build(REDIS_IMAGE, "docker/redis.Dockerfile", BASE_IMAGE=BASE_IMAGE)
    wheel = torch_wheel()
    with served_wheels([wheel] if wheel else []) as url:
        # Without the wheel on this host: the public PyTorch index (the Dockerfile's default).
        extra = {"TORCH_INDEX_URL": "", "WHEELS_URL": url} if url else {}
        times["cpu"] = docker_build(
            CPU_IMAGE, "docker/Dockerfile", "cpu", BASE_IMAGE=BASE_IMAGE, **extra
        )
    return times


def build_broken(tag: str = "brorl-ci/broken:cpu") -> str:
    """The cpu image less the learner's module: a broken image in a few seconds."""
    dockerfile = f"FROM {CPU_IMAGE}\nUSER root\nRUN rm -rf /app/services/learner\nUSER brorl\n"
    proc = subprocess.run(
        ["docker", "build", "-t", tag, "-"],
        input=dockerfile,
        capture_output=True,
        text=True,
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
        timeout=300,
    )
    if proc.returncode != 0:
        raise EngineError(f"building {tag} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return tag


def image_size_mb(tag: str) -> float:
    size = sh("docker", "image", "inspect", "--format", "{{.Size}}", tag).stdout.strip()
    return int(size) / 1e6
