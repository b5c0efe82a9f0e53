"""services/reward by layer: serving never imports training code or demo/, and one table names the
built-ins.

Serving is everything under services/reward except training/ (server, registry, config, functions/,
sandbox/); it may be imported by training, never the other way round. The built-in reward functions
are one table (config.BUILTIN_FUNCTIONS) that the registry, ListRewardFunctions and docs/rewards.md
agree with.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

from brorl.v1 import reward_pb2
from services.reward.config import BUILTIN_FUNCTIONS, DEFAULT_FUNCTIONS
from services.reward.registry import default_registry
from services.reward.server import RewardServicer

ROOT = Path(__file__).resolve().parents[4]
REWARD = ROOT / "services" / "reward"
FORBIDDEN = ("services.reward.training", "demo")
IMPORTERS = {"import_module", "__import__", "run_module", "spec_from_file_location"}


def serving_modules() -> list[Path]:
    files = sorted(p for p in REWARD.rglob("*.py") if "training" not in p.relative_to(REWARD).parts)
    assert len(files) > 15, "did not find the serving modules"
    return files


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, root: Path = ROOT) -> set[str]:
    """Every module an ``import`` anywhere in the file (top level or inside functions) may load,
    absolute."""
    tree = ast.parse(path.read_text())
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from ..training import x
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names.add(base)
            names.update(
                f"{base}.{a.name}" for a in node.names
            )  # from services.reward import training
        elif isinstance(
            node, ast.Call
        ):  # importlib.import_module("demo.model"), __import__("..."), ...
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in IMPORTERS:
                names.update(
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant) and isinstance(a.value, str)
                )
    return names


def forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def test_serving_never_imports_training_or_demo():
    bad = {
        str(p.relative_to(ROOT)): sorted(n for n in imported_names(p) if forbidden(n))
        for p in serving_modules()
    }
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, (
        "serving modules import training code or demo/ "
        f"(move shared code to functions/rm_format.py): {bad}"
    )


def test_the_checker_sees_every_form_of_import(tmp_path):
    pkg = tmp_path / "services" / "reward" / "functions"
    pkg.mkdir(parents=True)
    forms = [
        "import demo.model",
        "from demo import model",
        "from services.reward.training import rm_train",
        "from services.reward import training",
        "from ..training.rm_train import encode",
        "from .. import training",
        "import importlib; importlib.import_module('demo.model')",
    ]
    path = pkg / "mod.py"
    for form in forms:
        path.write_text("def lazy():\n    " + form + "\n")
        assert any(forbidden(n) for n in imported_names(path, tmp_path)), form
    path.write_text(
        "from .rm_format import encode\nfrom services.reward.functions import rm_format\n"
    )
    assert not any(forbidden(n) for n in imported_names(path, tmp_path))


def test_loading_the_service_loads_no_training_code_or_demo():
    code = (
        "import sys\nimport services.reward.server\n"
        "from services.reward.registry import default_registry\n"
        "default_registry().close()\n"
        "print(','.join(m for m in sys.modules if m == 'demo' or m.startswith(('demo.', "
        "'services.reward.training'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", f"the reward service loaded {out.stdout.strip()}"


def test_rm_train_runs_as_a_module():
    out = subprocess.run(
        [sys.executable, "-m", "services.reward.training.rm_train", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "services.reward.training.rm_train" in out.stdout, out.stderr[
        -2000:
    ]


def docs_builtins() -> dict[str, str]:
    """name → description from the "Built-in functions" table of docs/rewards.md."""
    text = (ROOT / "docs" / "rewards.md").read_text()
    section = text.split("### Built-in functions", 1)[1].split("\n#", 1)[0]
    return {
        m.group(1): m.group(2).strip()
        for m in re.finditer(r"^\| `([a-z_]+)` \|(.*)\|\s*$", section, re.M)
    }


def test_builtin_table_registry_list_and_docs_agree():
    names = list(BUILTIN_FUNCTIONS)
    assert list(DEFAULT_FUNCTIONS) == names
    assert all(b.spec().type == n for n, b in BUILTIN_FUNCTIONS.items()), (
        "a built-in is named after its type"
    )
    registry = default_registry()
    try:
        assert registry.names() == sorted(names)
        listed = RewardServicer(registry, 8).ListRewardFunctions(
            reward_pb2.ListRewardFunctionsRequest(), None
        )
        assert {f.name: f.description for f in listed.functions} == {
            n: b.description for n, b in BUILTIN_FUNCTIONS.items()
        }
    finally:
        registry.close()
    assert docs_builtins() == {n: b.description for n, b in BUILTIN_FUNCTIONS.items()}, (
        "docs/rewards.md 'Built-in functions' must list the names and descriptions of "
        "config.BUILTIN_FUNCTIONS"
    )
