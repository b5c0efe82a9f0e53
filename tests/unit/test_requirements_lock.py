"""requirements.lock, the exact versions scripts/setup.sh installs (with --no-deps), against
requirements.txt, the human-edited input: every package requirements.txt names is pinned with
`==` to a version its specifier admits, and the lock is closed under the dependencies of what it
pins (checked on the installed metadata of every locked version present here). Regenerate with
`python scripts/lock_requirements.py` (README: Setup and reproducible installs)."""

from __future__ import annotations

import importlib.util
import re
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements.lock"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")


def _lock_script():
    spec = importlib.util.spec_from_file_location(
        "lock_requirements", REPO / "scripts" / "lock_requirements.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def locked() -> dict[str, str]:
    """canonical name -> pinned version; every line must be an exact pin."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(LOCK.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"requirements.lock:{number}: {line!r} is not an exact name==version pin"
        name = canonicalize_name(match.group(1))
        assert name not in pins, f"requirements.lock:{number}: {name} pinned twice"
        pins[name] = match.group(2)
    return pins


def test_every_line_is_an_exact_pin_and_sorted():
    pins = locked()
    assert len(pins) > 50
    assert list(pins) == sorted(pins), "keep the generated order (sorted names)"


def test_lock_covers_every_package_of_requirements_txt():
    pins = locked()
    problems = []
    for req in _lock_script().read_requirements(REPO / "requirements.txt"):
        name = canonicalize_name(req.name)
        if name not in pins:
            problems.append(f"{req.name}: not in requirements.lock")
        elif not req.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{req.name}: locked {pins[name]} does not satisfy {req}")
    assert not problems, (
        "\n".join(problems) + "\nregenerate: python scripts/lock_requirements.py (README)"
    )


def test_what_setup_sh_builds_or_removes_stays_out_of_the_lock():
    script = _lock_script()
    pins = locked()
    assert script.BUILT_BY_SETUP not in pins, "setup.sh builds DeepSpeed without isolation"
    assert not script.NOT_INSTALLED & set(pins), "torchvision & co. break transformers here"
    assert script.deepspeed_pin().name == "deepspeed"


def test_lock_is_closed_under_the_dependencies_of_what_it_pins():
    """setup.sh installs with --no-deps: a dependency missing from the lock would be missing on
    a fresh machine. Checked through the metadata of each locked version installed here (after
    setup.sh, all of them), DeepSpeed's included."""
    script = _lock_script()
    pins = locked()
    allowed = set(pins) | script.NOT_INSTALLED
    checked, missing = 0, []
    owners = {**pins, script.BUILT_BY_SETUP: str(script.deepspeed_pin().specifier)[2:]}
    for name, version in owners.items():
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue
        if dist.version != version:
            continue
        checked += 1
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            if canonicalize_name(req.name) not in allowed:
                missing.append(f"{name} {version} needs {req}")
    assert checked >= len(pins) // 2, (
        f"only {checked} of {len(pins)} locked versions are installed: run scripts/setup.sh"
    )
    assert not missing, "\n".join(missing)
