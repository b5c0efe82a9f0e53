"""ScoreBatch latency of the reward service for 512 math paths and 512 code paths (one JSON object).

    python bench/reward.py [--repeats 10] [--paths 512] [--wall-s 2.0]

A real gRPC server on 127.0.0.1:0 in this process. Math paths are short integer answers (the RL
demo's shape); code paths are small Python functions, a quarter of them wrong, run against three
unit tests in the sandbox with 2 s wall / 2 s CPU limits. One warm-up call each (it starts the
sandbox), then ``repeats`` timed calls; p50/p95 are over those calls' wall-clock latency seen by the
client.
"""

from __future__ import annotations

import argparse
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
from services.reward.server import build_server  # noqa: E402

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


def timed(stub, fn: str, items: list, repeats: int) -> tuple[list[float], list]:
    request = reward_pb2.ScoreBatchRequest(reward_fn=fn, items=items)
    stub.ScoreBatch(request, timeout=300)  # warm-up
    times, last = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        last = stub.ScoreBatch(request, timeout=300)
        times.append((time.perf_counter() - start) * 1000)
    return times, last.results


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
    args = parser.parse_args(argv)
    code = {"type": "code", "mode": "partial", "wall_s": args.wall_s, "cpu_s": args.wall_s}
    if args.concurrency:
        code["concurrency"] = args.concurrency
    cfg = RewardServiceConfig(bind="127.0.0.1:0", functions={"code": code})
    server = build_server(cfg).start()
    server.set_serving(True)
    try:
        with rpc.channel(f"127.0.0.1:{server.port}") as channel:
            stub = reward_pb2_grpc.RewardServiceStub(channel)
            math_items = [
                reward_pb2.ScoreRequest(
                    id=f"m{i}",
                    prompt=f"{i}+{i}=",
                    completion=str(2 * i + (i % 3 == 0)),
                    reference=str(2 * i),
                )
                for i in range(args.paths)
            ]
            code_items = [
                reward_pb2.ScoreRequest(
                    id=f"c{i}",
                    completion=CODE_VARIANTS[i % len(CODE_VARIANTS)],
                    reference=CODE_TESTS,
                )
                for i in range(args.paths)
            ]
            math = summary(*timed(stub, "math_answer", math_items, args.repeats))
            code_result = summary(*timed(stub, "code", code_items, args.repeats))
        fn = server.registry.get("code")
        print(
            json.dumps(
                {
                    "bench": "reward_score_batch",
                    "paths": args.paths,
                    "math_answer": math,
                    "code": code_result,
                    "code_limits": {
                        "wall_s": args.wall_s,
                        "cpu_s": args.wall_s,
                        "concurrency": fn.spec.concurrency,
                        "isolation": fn.pool.isolation,
                    },
                    "cpus": os.cpu_count(),
                }
            )
        )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
