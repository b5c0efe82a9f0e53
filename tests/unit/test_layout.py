"""The shape of the tree (docs/design.md "Layers"): folders small enough to name, files and
functions short enough to read, and the README's annotated tree and docs/design.md naming exactly
the folders and modules on disk."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("brorl", "services", "envs", "kernels", "demo", "bench")
SOURCE = (*PACKAGES, "tests", "scripts", "docker")
MAX_MODULES, MAX_LINES, MAX_FUNCTION = 15, 400, 60


def python_folders(roots=SOURCE) -> dict[Path, list[Path]]:
    out: dict[Path, list[Path]] = {}
    for root in roots:
        for path in (ROOT / root).rglob("*.py"):
            if "node_modules" not in path.parts:
                out.setdefault(path.parent, []).append(path)
    return out


def test_no_folder_holds_more_than_15_modules():
    crowded = {
        str(folder.relative_to(ROOT)): n
        for folder, files in python_folders().items()
        if (n := sum(f.name != "__init__.py" for f in files)) > MAX_MODULES
    }
    assert not crowded, f"split these folders by layer: {crowded}"


def test_no_file_is_longer_than_400_lines():
    long = {
        str(f.relative_to(ROOT)): n
        for files in python_folders().values()
        for f in files
        if "/v1/" not in str(f) and (n := len(f.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long


def test_no_function_in_the_services_or_the_core_is_longer_than_60_lines():
    long = []
    for folder, files in python_folders(("brorl", "services")).items():
        rel = str(folder.relative_to(ROOT))
        if rel.startswith(("brorl/apps", "brorl/v1")):
            continue
        for f in files:
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > MAX_FUNCTION:
                        long.append(f"{f.relative_to(ROOT)}:{node.lineno} {node.name} ({n})")
    assert not long, long


def source_packages() -> set[str]:
    """Every folder of the packages that holds Python, as the tree writes it ("brorl/config/")."""
    return {
        str(folder.relative_to(ROOT)) + "/"
        for folder in python_folders(PACKAGES)
        if "__pycache__" not in folder.parts
    }


def readme_tree() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text[text.index("## Layout") :]
    block = block[block.index("```") + 3 :]
    block = block[: block.index("```")]
    return [line.split()[0] for line in block.splitlines() if line and not line[0].isspace()]


def test_the_readme_tree_names_exactly_the_source_folders():
    named = {n for entry in readme_tree() for n in entry.rstrip(",").split(",") if n}
    packages = source_packages()
    named_packages = {n for n in named if n.split("/")[0] in PACKAGES}
    assert named_packages == packages, (
        f"on disk, not in README.md's tree: {sorted(packages - named_packages)}; "
        f"in the tree, not on disk: {sorted(named_packages - packages)}"
    )
    for entry in named - named_packages:  # configs/, docs/, deploy/k8s/, ...
        assert (ROOT / entry.rstrip("/")).exists() or list(ROOT.glob(entry)), entry


def test_the_design_map_names_every_service_layer_and_only_modules_that_exist():
    text = (ROOT / "docs" / "design.md").read_text()
    for folder in sorted(source_packages()):
        if folder.startswith("services/"):
            leaf = folder.removeprefix("services/")
            parent, _, name = leaf.rstrip("/").rpartition("/")
            assert f"{folder}" in text or (parent and f"  {name}/" in text), folder
    block = text[text.index("## The services, by layer") :]
    block = block[block.index("```") + 3 :]
    service, folder, checked = None, "", 0
    for line in block[: block.index("```")].splitlines():
        indent = len(line) - len(line.lstrip())
        head = re.split(r"\s{2,}", line.strip())[0] if line.strip() else ""
        if indent == 0 and head.startswith("services/"):
            service, folder = head.split()[0], ""
            continue
        if indent > 4 or not service:
            continue  # a description's continuation
        if indent == 2 and re.fullmatch(r"\w+/", head):
            folder = head
            assert (ROOT / service / folder).is_dir(), service + folder
            continue
        if indent == 2:
            folder = ""  # modules at the service's top
        for module in re.findall(r"\b(\w+\.py)\b", head):
            assert (ROOT / service / folder / module).exists(), f"{service}{folder}{module}"
            checked += 1
    assert checked > 40, checked  # the map was read
