"""The dependency rules of docs/design.md ("Dependency rules"), one test each: brorl imports no
torch/vllm/deepspeed/triton; services never import each other; vllm only in the rollout's
engine.py (driver) and reload.py (inside vLLM's worker); deepspeed only in the learner's
model/deepspeed_engine.py; triton only in kernels/; redis only in brorl/queue.py,
brorl/streams.py and the apps; prometheus_client only in brorl/metrics.py (and a client of the
core never loads it); wandb and mlflow only in observe/trackers.py, TensorBoard only in
observe/sinks.py; the learner's algo/ is pure math; the rollout's tail process loads no torch,
vllm or transformers; brorl/priority.py (the launcher's and the tail process's) is standard
library only. Also: the core (brorl/ outside brorl/apps/) never imports the apps,
services never import the demo package, and no package has an import cycle.

Every rule counts imports anywhere in a file, including those inside functions."""

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


def imported_names(path: Path, module: str) -> set[str]:
    """Every name an import in ``path`` (module ``module``) may load: ``import a.b`` gives a.b;
    ``from a import b`` gives a and a.b; relative imports are resolved against ``module``."""
    is_package = path.name == "__init__.py"
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                anchor = parts[: len(parts) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
    return names


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def py_files(folder: str):
    return [p for p in (ROOT / folder).rglob("*.py") if "/v1/" not in str(p)]


def test_core_imports_no_heavy_framework():
    for path in py_files("brorl"):
        bad = {
            n
            for n in imports_of(path)
            if n.split(".")[0] in HEAVY | {"services", "demo", "kernels"}
        }
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_importing_every_core_module_loads_no_torch():
    modules = [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in py_files("brorl")]
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + (
            "bad = [m for m in ('torch','vllm','deepspeed','triton') if m in sys.modules]\n"
            "print(','.join(bad))"
        )
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", f"importing brorl loaded {out.stdout.strip()}"


def test_services_do_not_import_each_other():
    for svc in ("rollout", "reward", "learner"):
        for path in py_files(f"services/{svc}"):
            for name in imports_of(path):
                parts = name.split(".")
                if parts[0] == "services" and len(parts) > 1:
                    assert parts[1] == svc, f"{path.relative_to(ROOT)} imports {name}"


SINKS = "services/learner/observe/sinks.py"


def test_framework_imports_stay_in_their_module():
    owners = {
        "vllm": {"services/rollout/engine.py", "services/rollout/reload.py"},
        "deepspeed": {"services/learner/model/deepspeed_engine.py"},
        "prometheus_client": {"brorl/metrics.py"},
        "wandb": {"services/learner/observe/trackers.py"},
        "mlflow": {"services/learner/observe/trackers.py"},
        "tensorboard": set(),  # written through torch.utils.tensorboard, in sinks.py only
        "zstandard": {"brorl/weights/codec.py"},  # one delta format, one owner
    }
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
        if any(n.startswith("torch.utils.tensorboard") for n in imports_of(path)):
            assert rel == SINKS, f"{rel} imports torch.utils.tensorboard"


def test_the_rollout_tail_process_loads_no_torch_or_vllm():
    """The tail process (services/rollout/tail/process.py) is spawned beside each worker: what
    it imports, and what unpickling a call's samples and episodes imports, stays light."""
    modules = [
        "services.rollout." + m for m in ("tail.process", "tail.finish", "engine", "episodes")
    ]
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "from brorl import rpc\nfrom brorl.v1 import reward_pb2_grpc\n"
        + "print(','.join(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", f"the tail process loads {out.stdout.strip()}"


def test_a_client_of_the_core_loads_no_prometheus_client():
    """brorl.metrics is imported by the services' composition roots, never by what a client
    imports (brorl.rpc only names it for type checking)."""
    code = (
        "import sys\n"
        "import brorl.client, brorl.rpc, brorl.config.run, brorl.queue, brorl.apps.cli\n"
        "print('prometheus_client' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


PACKAGES = ("brorl", "services", "envs", "kernels", "demo", "bench")


def import_graph(packages=PACKAGES) -> dict[str, set[str]]:
    """Module → the project modules it imports (the longest module prefix of each imported
    name), over every package; generated stubs left out."""
    paths = {
        module_name(p): p
        for pkg in packages
        for p in (ROOT / pkg).rglob("*.py")
        if "/v1/" not in str(p)
    }
    graph = {}
    for mod, path in paths.items():
        targets = set()
        for name in imported_names(path, mod):
            parts = name.split(".")
            hit = next(
                (
                    ".".join(parts[:k])
                    for k in range(len(parts), 0, -1)
                    if ".".join(parts[:k]) in paths
                ),
                None,
            )
            if hit and hit != mod:
                targets.add(hit)
        graph[mod] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that starts and ends at the same node, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_reports_the_path():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]


def test_no_import_cycle_in_any_package():
    graph = import_graph()
    assert {"brorl.apps.cli", "brorl.apps.recipe", "brorl.config.base"} <= set(graph)
    assert {"services.learner.train", "kernels.logprobs", "demo.model", "bench.e2e"} <= set(graph)
    assert (
        "brorl.apps.recipe" in graph["brorl.apps.demo_cmd"]
    )  # `from brorl.apps import recipe` is that module
    assert "services.learner.algo.advantages" in graph["services.learner.model.policy"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_core_does_not_import_the_apps():
    for path in py_files("brorl"):
        mod = module_name(path)
        if mod == "brorl.apps" or mod.startswith("brorl.apps."):
            continue
        bad = {
            n for n in imported_names(path, mod) if n == "brorl.apps" or n.startswith("brorl.apps.")
        }
        assert not bad, (
            f"{path.relative_to(ROOT)} (core) imports {bad}; the apps build on the core, not back"
        )


def test_environments_are_reached_over_grpc_only():
    """No service imports envs/ (an environment is another process, in any language), and the
    environments import only the core of brorl (no service, torch, vLLM or the demo)."""
    for path in (ROOT / "services").rglob("*.py"):
        bad = {n for n in imported_names(path, module_name(path)) if n.split(".")[0] == "envs"}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"
    for path in py_files("envs"):
        tops = {n.split(".")[0] for n in imports_of(path)}
        assert not tops & (HEAVY | {"services", "demo", "kernels"}), (path, tops)


def test_services_do_not_import_the_demo():
    for path in (ROOT / "services").rglob("*.py"):
        bad = {n for n in imported_names(path, module_name(path)) if n.split(".")[0] == "demo"}
        assert not bad, (
            f"{path.relative_to(ROOT)} imports {bad}; "
            "services must not depend on the CPU demo (demo/)"
        )


def test_only_the_queue_layer_holds_a_redis_client():
    """Services reach Redis through brorl.queue / brorl.streams (keys, retries and outages are
    handled there); the apps may ping and start a local Redis."""
    allowed = {"brorl/queue.py", "brorl/streams.py"}
    for folder in ("brorl", "services", "demo", "kernels"):
        for path in py_files(folder):
            rel = str(path.relative_to(ROOT))
            if "redis" in {n.split(".")[0] for n in imports_of(path)}:
                assert rel in allowed or rel.startswith("brorl/apps/"), f"{rel} imports redis"


def test_client_modules_load_no_numpy():
    """numpy is for the weight codec (brorl/weights/codec.py, brorl/weights/chain.py), which the
    learner, the rollout engine and the demo import; a client of the services needs none."""
    code = (
        "import sys\n"
        "import brorl.client, brorl.queue, brorl.streams, brorl.weights.store, brorl.config.run\n"
        "print('numpy' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False", "a client-side core module imports numpy"


def test_the_learners_pure_math_imports_no_engine_model_or_transport():
    """services/learner/algo/ (advantages, GAE, importance ratios, KL control, the surrogate
    loss) holds pure tensor functions with float64 twins: no DeepSpeed, no Hugging Face model,
    no gRPC/Redis, no learner module outside algo/ (kernels are allowed: they are pure too)."""
    algo = sorted((ROOT / "services" / "learner" / "algo").glob("*.py"))
    assert len(algo) >= 5, algo  # the folder is where the test looks
    for path in algo:
        mod = module_name(path)
        names = imported_names(path, mod)
        tops = {n.split(".")[0] for n in names}
        assert not tops & {"deepspeed", "transformers", "grpc", "redis", "vllm"}, (mod, tops)
        outside = {
            n
            for n in names
            if n.startswith("services.")
            and not n.startswith("services.learner.algo")
            and n != "services.learner"
        }
        assert not outside, (mod, outside)


def test_the_priority_module_is_standard_library_only():
    """brorl/priority.py runs in the launcher and first thing in the tail process, before it
    starts a thread: it may load nothing that starts one or is heavy."""
    tops = {n.split(".")[0] for n in imports_of(ROOT / "brorl" / "priority.py")}
    assert tops <= set(sys.stdlib_module_names) | {"__future__"}, tops


def test_hugging_faces_attention_registry_has_one_owner():
    """The learner's attention (services/learner/model/prefix_attention.py) is registered with
    Hugging Face's attention and mask registries in that module only, and it imports no other
    learner module: the forward (forward.py) and the loader (pretrained.py) use it, not the
    reverse."""
    owner = "services/learner/model/prefix_attention.py"
    for path in ROOT.glob("**/*.py"):
        rel = str(path.relative_to(ROOT))
        if rel.startswith(("tests/", ".")) or rel == owner:
            continue
        text = path.read_text()
        names = imports_of(path)
        assert "transformers.masking_utils" not in names, f"{rel} imports transformers' masks"
        assert "AttentionInterface" not in text, f"{rel} names Hugging Face's attention registry"
    mod = module_name(ROOT / owner)
    names = imported_names(ROOT / owner, mod)
    assert {n.split(".")[0] for n in names} <= {
        "__future__", "contextlib", "contextvars", "typing", "torch", "transformers",
    }, names  # fmt: skip


def test_sharing_a_groups_prompt_knows_no_engine_or_model():
    """services/learner/model/prompt_once.py shares a group's prompt pass between its chunks
    through plain autograd (leaves, a surrogate term): it imports no DeepSpeed and no Hugging Face
    model, and of the learner only the forward (forward.py) and the batch (batch.py); the policy
    uses it, not the reverse. Whether an engine allows it (its ZeRO stage) is the policy's call."""
    path = ROOT / "services" / "learner" / "model" / "prompt_once.py"
    names = imported_names(path, module_name(path))
    assert not {n.split(".")[0] for n in names} & {"deepspeed", "transformers", "grpc", "redis"}
    learner = {n for n in names if n.startswith("services.")}
    allowed = ("services.learner.model.forward", "services.learner.model.batch")
    assert all(n.startswith(allowed) or n == "services.learner.model" for n in learner), learner
