"""Overload: concurrent clients against rollout Generate and reward ScoreBatch (one JSON object).

    python bench/load.py [--clients 64] [--seconds 20] [--max-concurrent-rpcs 8] [--n 4]
                         [--max-tokens 8] [--batch 64] [--rss-growth-bound-mib 64] [--model DIR]

Starts the reward service and a rollout worker (worker_loop off, the demo's tiny model unless
--model) as separate processes (brorl.apps.cluster.launcher.ServiceProc) with a small
``max_concurrent_rpcs`` so that the clients overload them and admission control has to shed.
Each RPC is driven in turn by ``clients`` threads (one channel each) for ``seconds``: a thread
calls, records latency and status, and after RESOURCE_EXHAUSTED waits ``--shed-backoff-ms``
before it tries again (as a real client backs off). Latency percentiles are over OK calls, as the
client sees them. RSS is the sum of VmRSS over a service's process tree (vLLM runs its engine in a
child process), read after a warm-up and again after the load; ``rss_growth_ok`` is true when
each service grew by at most ``--rss-growth-bound-mib``.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from brorl.apps.cluster.service_proc import ServiceProc, stop_all  # noqa: E402
from brorl.v1 import common_pb2, reward_pb2, reward_pb2_grpc, rollout_pb2, rollout_pb2_grpc  # noqa: E402,E501


# the printed object's documented keys (tests/unit/bench/test_bench_smoke.py checks them)
KEYS = ("rpcs", "shed", "rss_mib_before", "rss_mib_after", "rss_growth_mib", "rss_growth_ok",
        "services_alive_after")  # fmt: skip


def tree_rss_mib(pid: int) -> float:
    """VmRSS of ``pid`` and all its descendants, from /proc (MiB)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children[int(fields[1])].append(int(stat.parent.name))
    total_kib, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
        except OSError:
            pass
    return round(total_kib / 1024, 1)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))], 2)


def drive(make_call, clients: int, seconds: float, backoff_s: float, timeout_s: float) -> dict:
    """``clients`` threads, each with its own call, for ``seconds``; latencies and codes."""
    latencies: list[float] = []
    codes: collections.Counter = collections.Counter()
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client() -> None:
        call, channel = make_call()
        mine, seen = [], collections.Counter()
        while time.monotonic() < stop_at:
            start = time.perf_counter()
            try:
                call(timeout=timeout_s)
                mine.append((time.perf_counter() - start) * 1000)
                seen["OK"] += 1
            except grpc.RpcError as exc:
                seen[exc.code().name] += 1
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    time.sleep(backoff_s)
        channel.close()
        with lock:
            latencies.extend(mine)
            codes.update(seen)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - began
    return {
        "requests": sum(codes.values()),
        "ok": codes["OK"],
        "resource_exhausted": codes["RESOURCE_EXHAUSTED"],
        "other_codes": {k: v for k, v in codes.items() if k not in ("OK", "RESOURCE_EXHAUSTED")},
        "ok_per_s": round(codes["OK"] / elapsed, 1),
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "p99_ms": percentile(latencies, 99),
        "seconds": round(elapsed, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=20.0, help="per RPC")
    ap.add_argument("--max-concurrent-rpcs", type=int, default=8, help="of both services")
    ap.add_argument("--n", type=int, default=4, help="paths per Generate")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64, help="items per ScoreBatch")
    ap.add_argument("--shed-backoff-ms", type=float, default=20.0)
    ap.add_argument("--timeout-s", type=float, default=30.0, help="deadline of each call")
    ap.add_argument("--rss-growth-bound-mib", type=float, default=64.0)
    ap.add_argument("--model", default="", help="rollout model dir (default: a tiny one)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="brorl-load-"))
    model = args.model
    if not model:
        from demo.model import create_tiny_model

        model = str(create_tiny_model(tmp / "tiny", seed=0))
    limit = {"max_concurrent_rpcs": args.max_concurrent_rpcs}
    procs = {
        "reward": ServiceProc("reward", tmp, **limit),
        "rollout": ServiceProc("rollout", tmp, model=model, worker_loop="false", **limit),
    }
    try:
        for p in procs.values():
            p.wait_serving()
        sampling = common_pb2.SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_tokens)
        generate = rollout_pb2.GenerateRequest(prompt="12+34=", sampling=sampling)
        batch = reward_pb2.ScoreBatchRequest(
            reward_fn="math_answer",
            items=[
                reward_pb2.ScoreRequest(id=str(i), completion=f"{i % 7}", reference="3")
                for i in range(args.batch)
            ],
        )

        def generate_call():
            channel = grpc.insecure_channel(procs["rollout"].address)
            stub = rollout_pb2_grpc.RolloutServiceStub(channel)
            return (lambda timeout: stub.Generate(generate, timeout=timeout)), channel

        def score_call():
            channel = grpc.insecure_channel(procs["reward"].address)
            stub = reward_pb2_grpc.RewardServiceStub(channel)
            return (lambda timeout: stub.ScoreBatch(batch, timeout=timeout)), channel

        calls = {"rollout.Generate": generate_call, "reward.ScoreBatch": score_call}
        for make in calls.values():  # warm-up: engine graphs, the reward functions
            call, channel = make()
            for _ in range(3):
                call(timeout=120)
            channel.close()
        rss_before = {name: tree_rss_mib(p.pid) for name, p in procs.items()}
        results = {
            name: drive(
                make,
                args.clients,
                args.seconds,
                args.shed_backoff_ms / 1000,
                args.timeout_s,
            )
            for name, make in calls.items()
        }
        rss_after = {name: tree_rss_mib(p.pid) for name, p in procs.items()}
        growth = {name: round(rss_after[name] - rss_before[name], 1) for name in procs}
        alive = {name: p.popen.poll() is None for name, p in procs.items()}
    finally:
        stop_all(procs.values())
    print(
        json.dumps(
            {
                "clients": args.clients,
                "seconds_per_rpc": args.seconds,
                "max_concurrent_rpcs": args.max_concurrent_rpcs,
                "generate": {"n": args.n, "max_tokens": args.max_tokens},
                "score_batch_items": args.batch,
                "rpcs": results,
                "shed": any(r["resource_exhausted"] for r in results.values()),
                "rss_mib_before": rss_before,
                "rss_mib_after": rss_after,
                "rss_growth_mib": growth,
                "rss_growth_bound_mib": args.rss_growth_bound_mib,
                "rss_growth_ok": all(g <= args.rss_growth_bound_mib for g in growth.values()),
                "services_alive_after": alive,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
