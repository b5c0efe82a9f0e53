"""ScoreBatch latency of the reward service for groups of 512 math and 512 code paths (one JSON
object).

    python bench/reward.py [--repeats 10] [--paths 512] [--wall-s 2.0] [--baseline-math FILE]

A real gRPC server on 127.0.0.1:0 in this process. Four math groups:

* ``math_answer``: short integer answers (the RL demo's shape; settled in the service process);
* ``math_latex``: solution-style completions ending in ``\\boxed{...}`` against ``\\frac{3}{4}``,
  every answer in a call distinct (equivalent forms and wrong ones: fractions, decimals, percents,
  roots, multiples of pi, polynomials, tuples), and fresh answers in every call, so neither the
  per-batch dedup nor the workers' parse caches help: the cost of 512 real comparisons;
  half of them (fractions, tuples, polynomials) are settled in the service, half need math-verify;
* ``math_latex_group``: the same completions, but with the repetition of a wide group (512 paths,
  64 distinct answers), where identical answers are compared once;
* ``math_latex_symbolic``: 512 distinct answers that all need math-verify (decimals, percents,
  radicals, multiples of pi, ``x = a/b``, a root that cancels): the worker-bound cost.

``--baseline-math FILE`` also registers another ``math_verifier.py`` (e.g. main's, from ``git show
main:services/reward/functions/math_verifier.py > FILE``) as ``math_answer_baseline`` and times
the integer group through it in the same server, the same run. Code paths are small Python
functions, a quarter of them wrong, run against three unit tests in the sandbox with 2 s wall /
2 s CPU limits. One warm-up call each (it starts the sandbox and the math workers), then
``repeats`` timed calls; p50/p95 are over those calls' wall-clock latency seen by the client.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from brorl import rpc  # noqa: E402
from brorl.v1 import reward_pb2, reward_pb2_grpc  # noqa: E402
from services.reward.config import RewardServiceConfig  # noqa: E402
from services.reward.registry import build_registry  # noqa: E402
from services.reward.server import build_server  # noqa: E402

# the printed object's documented keys (tests/unit/bench/test_bench_smoke.py checks them)
KEYS = ("bench", "paths", "math_answer", "math_latex", "math_latex_group", "math_latex_symbolic",
        "code", "code_limits", "math_workers")  # fmt: skip
CODE_TESTS = json.dumps(
    {"tests": ["assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]}
)
CODE_VARIANTS = [
    "def add(a, b):\n    return a + b\n",
    "```python\ndef add(a, b):\n    total = 0\n    for x in (a, b):\n        total += x\n"
    "    return total\n```",
    "def add(a, b):\n    return sum([a, b])\n",
    "def add(a, b):\n    return a - b\n",
]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


# Answers equal to 3/4 and near misses; {k} makes each one distinct.
LATEX_FORMS = [
    "\\frac{{{a}}}{{{b}}}",
    "\\dfrac{{{a}}}{{{b}}}",
    "{d}",
    "{p}\\%",
    "\\frac{{\\sqrt{{{k}}}}}{{{k}}}",
    "{k}\\pi",
    "x^{{2}}+{k}x",
    "({k}, {a})",
]


# Answers only math-verify can settle (no in-process shortcut applies to any of them).
SYMBOLIC_FORMS = [
    "{d}",
    "{p}\\%",
    "\\frac{{\\sqrt{{{k}}}}}{{{k}}}",
    "{k}\\pi",
    "x = \\frac{{{a}}}{{{b}}}",
    "\\sqrt{{{k}}} - \\sqrt{{{k}}} + \\frac{{{a}}}{{{b}}}",
]


def latex_item(i: int, k: int, reference: str, forms=LATEX_FORMS) -> reward_pb2.ScoreRequest:
    """A solution-style completion whose boxed answer is form ``i % len(forms)`` with parameter
    ``k``; a third of them equal 3/4."""
    right = k % 3 == 0
    a, b = (3 * k, 4 * k) if right else (3 * k + 1, 4 * k)
    value = a / b
    percent = f"{100 * value:.4f}".rstrip("0").rstrip(".")
    answer = forms[i % len(forms)].format(
        a=a, b=b, k=k, d=f"{value:.{len(str(b)) + 4}f}", p=percent
    )
    return reward_pb2.ScoreRequest(
        id=f"l{i}",
        prompt="Compute the ratio.",
        completion=f"Step {i}: the ratio reduces, so the answer is $\\boxed{{{answer}}}$.",
        reference=reference,
    )


def latex_items(n: int, call: int, distinct: int = 0, forms=LATEX_FORMS) -> list:
    """n completions, answers fresh for each call; distinct > 0: only that many different
    answers, repeated."""
    out = []
    for i in range(n):
        j = i % distinct if distinct else i
        out.append(latex_item(j, 1 + j // len(forms) + call * n, "\\frac{3}{4}", forms))
    return out


def timed(stub, fn: str, make, repeats: int) -> tuple[list[float], list]:
    """``make(call)`` builds the items of each call (call 0 is the warm-up)."""
    stub.ScoreBatch(reward_pb2.ScoreBatchRequest(reward_fn=fn, items=make(0)), timeout=300)
    times, last = [], None
    for call in range(1, repeats + 1):
        request = reward_pb2.ScoreBatchRequest(reward_fn=fn, items=make(call))
        start = time.perf_counter()
        last = stub.ScoreBatch(request, timeout=300)
        times.append((time.perf_counter() - start) * 1000)
    return times, last.results


def baseline_function(path: str, name: str):
    """The MathAnswer class of another math_verifier.py file, registered under ``name``."""
    spec = importlib.util.spec_from_file_location("baseline_math_verifier", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MathAnswer(name)


def summary(times: list[float], results) -> dict:
    per_path = [r.latency_ms for r in results]
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    return {
        "p50_ms": round(percentile(times, 50), 2),
        "p95_ms": round(percentile(times, 95), 2),
        "mean_ms": round(statistics.fmean(times), 2),
        "calls": len(times),
        "per_path_p50_ms": round(percentile(per_path, 50), 3),
        "per_path_p95_ms": round(percentile(per_path, 95), 3),
        "mean_reward": round(statistics.fmean(r.reward for r in results), 4),
        "statuses": statuses,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--paths", type=int, default=512)
    parser.add_argument("--wall-s", type=float, default=2.0)
    parser.add_argument(
        "--concurrency", type=int, default=0, help="sandbox pool size (0: the default)"
    )
    parser.add_argument(
        "--baseline-math", default="", help="another math_verifier.py to time on the int group"
    )
    args = parser.parse_args(argv)
    code = {"type": "code", "mode": "partial", "wall_s": args.wall_s, "cpu_s": args.wall_s}
    if args.concurrency:
        code["concurrency"] = args.concurrency
    cfg = RewardServiceConfig(bind="127.0.0.1:0", functions={"code": code})
    registry = build_registry(cfg)
    if args.baseline_math:
        registry.add(baseline_function(args.baseline_math, "math_answer_baseline"))
    server = build_server(cfg, registry).start()
    server.set_serving(True)
    try:
        with rpc.channel(f"127.0.0.1:{server.port}") as channel:
            stub = reward_pb2_grpc.RewardServiceStub(channel)
            results = math_results(stub, args)
            code_items = [
                reward_pb2.ScoreRequest(
                    id=f"c{i}",
                    completion=CODE_VARIANTS[i % len(CODE_VARIANTS)],
                    reference=CODE_TESTS,
                )
                for i in range(args.paths)
            ]
            results["code"] = summary(*timed(stub, "code", lambda _: code_items, args.repeats))
        fn = server.registry.get("code")
        limits = {"wall_s": args.wall_s, "cpu_s": args.wall_s, "concurrency": fn.spec.concurrency}
        results["code_limits"] = {**limits, "isolation": fn.pool.isolation}
        results["math_workers"] = registry.get("math_answer").spec.processes
        print(json.dumps({"bench": "reward_score_batch", "paths": args.paths, **results,
                          "cpus": os.cpu_count()}))  # fmt: skip
    finally:
        server.stop()
    return 0


def math_results(stub, args) -> dict:
    """The three math groups; with a baseline, its integer group is timed call for call in turn
    with this checkout's, so both see the same machine."""
    ints = [
        reward_pb2.ScoreRequest(
            id=f"m{i}",
            prompt=f"{i}+{i}=",
            completion=str(2 * i + (i % 3 == 0)),
            reference=str(2 * i),
        )
        for i in range(args.paths)
    ]
    results = {}
    if args.baseline_math:
        rounds = {"math_answer_baseline": ([], None), "math_answer": ([], None)}
        for _ in range(args.repeats):
            for fn in rounds:
                times, last = timed(stub, fn, lambda _: ints, 1)
                rounds[fn] = (rounds[fn][0] + times, last)
        results = {fn: summary(*got) for fn, got in rounds.items()}
    else:
        results["math_answer"] = summary(*timed(stub, "math_answer", lambda _: ints, args.repeats))
    n = args.paths
    latex = timed(stub, "math_answer", lambda c: latex_items(n, c), args.repeats)
    results["math_latex"] = summary(*latex)
    group = timed(stub, "math_answer", lambda c: latex_items(n, c, 64), args.repeats)
    results["math_latex_group"] = summary(*group)
    forms = SYMBOLIC_FORMS
    symbolic = timed(stub, "math_answer", lambda c: latex_items(n, c, 0, forms), args.repeats)
    results["math_latex_symbolic"] = summary(*symbolic)
    return results


if __name__ == "__main__":
    sys.exit(main())
