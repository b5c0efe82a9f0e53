"""DESIGN.md §2: brorl imports no torch/vllm/deepspeed/triton, services never import each other,
vllm only in services/rollout/engine.py, deepspeed only in services/learner/strategy.py,
triton only in kernels/."""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = {"torch", "vllm", "deepspeed", "triton", "transformers"}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def py_files(folder: str):
    return [p for p in (ROOT / folder).rglob("*.py") if "/v1/" not in str(p)]


def test_core_imports_no_heavy_framework():
    for path in py_files("brorl"):
        bad = {n for n in imports_of(path) if n.split(".")[0] in HEAVY | {"services", "demo", "kernels"}}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_importing_every_core_module_loads_no_torch():
    modules = [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in py_files("brorl")]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules) +
            "bad = [m for m in ('torch','vllm','deepspeed','triton') if m in sys.modules]\nprint(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing brorl loaded {out.stdout.strip()}"


def test_services_do_not_import_each_other():
    for svc in ("rollout", "reward", "learner"):
        for path in py_files(f"services/{svc}"):
            for name in imports_of(path):
                parts = name.split(".")
                if parts[0] == "services" and len(parts) > 1:
                    assert parts[1] == svc, f"{path.relative_to(ROOT)} imports {name}"


def test_framework_imports_stay_in_their_module():
    owners = {"vllm": {"services/rollout/engine.py"}, "deepspeed": {"services/learner/strategy.py"}}
    for path in ROOT.glob("**/*.py"):
        rel = str(path.relative_to(ROOT))
        if rel.startswith(("tests/", "bench/", ".")) or "/bench/" in rel:
            continue
        roots = {n.split(".")[0] for n in imports_of(path)}
        for lib, allowed in owners.items():
            if lib in roots:
                assert rel in allowed, f"{rel} imports {lib}; only {allowed} may"
        if "triton" in roots:
            assert rel.startswith("kernels/"), f"{rel} imports triton; only kernels/ may"
