"""1-bit Adam against AdamW on R learner ranks over gloo, at 25 M parameters (the demo's Qwen2
shape widened: hidden 512, 8 layers, as bench/weights.py). Prints ONE JSON object.

    python bench/onebit_adam.py [--ranks 2] [--updates 6] [--warmup 2] [--n 64] [--threads 1]
                                [--tiny]

Each optimizer runs in its own process tree through the learner's real rank machinery
(services/learner/ranks.py: rank 0 broadcasts the groups, every rank runs its share of the
chunks in its DeepSpeed engine); ``--updates`` updates on the same demo-shaped groups (4 groups
of ``--n`` paths, completions of 2-6 tokens), the first ``--warmup`` of 1-bit Adam's exact AdamW.
Reported per optimizer: seconds per update (the first one, with its allocations, left out) and
its phases; for 1-bit Adam the bytes rank 0 sent per update in the warm-up (the fp32 all-reduce)
and after it (CountingComm, services/learner/model/onebit_adam.py), and their ratio. AdamW's
own all-reduce runs inside DeepSpeed: its bytes are the same ring count of n fp32 values.

``exchange``: the collectives alone on R gloo processes — one fp32 all-reduce of n values
against one 1-bit exchange (compress, all-to-all, serve, all-gather, decode) of n values, best of
5: what a step spends on communication here, where the ranks share one machine's memory.
``--tiny``: the demo's 0.8 M-parameter model instead (the smoke test's size: the figures mean
nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = dict(hidden_size=512, layers=8, heads=8, kv_heads=4, intermediate_size=1536)
# the printed object's documented keys (tests/unit/bench/test_bench_smoke.py checks them)
KEYS = ("bench", "params", "adamw.update_s", "onebit_adam.update_s", "onebit_adam.bytes_ratio",
        "exchange", "targets")  # fmt: skip
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def demo_groups(n: int, count: int = 4):
    import random

    from brorl.v1 import common_pb2

    rng, out = random.Random(0), []
    for g in range(count):
        prompt = [1] + [rng.randrange(4, 14) for _ in range(5)]
        group = common_pb2.PathGroup(group_id=f"g{g}", prompt_token_ids=prompt)
        for i in range(n):
            toks = [rng.randrange(4, 21) for _ in range(rng.randint(2, 6))]
            group.paths.add(
                path_id=f"g{g}/{i}",
                token_ids=toks,
                logprobs=[-1.0] * len(toks),
                reward=float(rng.random() < 0.5),
                sampling=common_pb2.SamplingParams(n=n, temperature=1.0, top_k=-1, top_p=1.0),
            )
        out.append(group)
    return out


def rank_run(spec: dict) -> None:
    """One optimizer on R ranks (this process is rank 0, or a rank it started)."""
    import torch

    torch.set_num_threads(spec["threads"])
    from brorl.config.run import RunConfig
    from services.learner import ranks
    from services.learner.server import make_policy

    train = {"lr": 2e-4, "optimizer": spec["optimizer"], "onebit_freeze_steps": spec["warmup"]}
    cfg = RunConfig.model_validate(
        {"model": spec["model"], "data": {"train_path": "-"}, "train": train}
    )
    make = make_policy(0)
    children = ranks.start_ranks(spec["ranks"], 120.0)
    if int(os.environ["RANK"]) > 0:
        ranks.follow(make)
        return
    group = ranks.RankGroup(spec["ranks"], children, 30.0)
    try:
        policy = ranks.DistributedPolicy(group, cfg, make)
        optimizer = policy.local.engine.optimizer
        groups, rows = demo_groups(spec["n"]), []
        for _ in range(spec["updates"]):
            before = dict(getattr(optimizer, "comm", None).sent) if spec["counted"] else {}
            start = time.perf_counter()
            stats = policy.update(groups)
            row = {"update_s": time.perf_counter() - start}
            row.update({k.split("/")[1]: v for k, v in stats.items() if k.endswith("_s")})
            if spec["counted"]:
                row["bytes"] = sum(optimizer.comm.sent.values()) - sum(before.values())
            rows.append(row)
        n = sum(p.numel() for p in policy.local.model.parameters())
        Path(spec["out"]).write_text(json.dumps({"params": n, "updates": rows}))
    finally:
        group.close()


def run_optimizer(name: str, model: str, args, tmp: Path) -> dict:
    out = tmp / f"{name}.json"
    spec = {
        "optimizer": name,
        "model": model,
        "ranks": args.ranks,
        "updates": args.updates,
        "warmup": args.warmup,
        "n": args.n,
        "threads": args.threads,
        "out": str(out),
        "counted": name == "onebit_adam",
    }
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    env.update(PYTHONPATH=str(ROOT), DS_ACCELERATOR="cpu", TRANSFORMERS_VERBOSITY="error")
    done = subprocess.run(
        [sys.executable, __file__, "--rank-run", json.dumps(spec)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def summary(result: dict, warmup: int, counted: bool) -> dict:
    rows = result["updates"][1:]  # the first update allocates: left out
    out = {"update_s": statistics.median(r["update_s"] for r in rows)}
    for phase in ("forward", "backward", "optimizer"):
        out[f"{phase}_s"] = statistics.median(r.get(f"{phase}_s", 0.0) for r in rows)
    if counted:
        warm = [r for r in result["updates"][:warmup]]
        comp = [r for r in result["updates"][warmup:]]
        out["bytes_per_rank_warmup"] = warm[0]["bytes"]
        out["bytes_per_rank_compressed"] = comp[0]["bytes"]
        out["bytes_ratio"] = comp[0]["bytes"] / warm[0]["bytes"]
        out["update_s_warmup"] = statistics.median(r["update_s"] for r in warm[1:] or warm)
        out["update_s_compressed"] = statistics.median(r["update_s"] for r in comp)
    return out


def exchange_rank(rank: int, world: int, port: int, n: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from services.learner.model import compressed_comm as cc
    from services.learner.model.onebit_adam import BLOCK, CountingComm, compressed_allreduce

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    comm, size = CountingComm(), cc.slice_size(n, world, BLOCK)
    x = torch.randn(world * size)
    worker, server = torch.zeros(world * size), torch.zeros(size)

    def best(fn) -> float:
        times = []
        for _ in range(5):
            dist.barrier()
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    fp32 = best(lambda: comm.all_reduce_mean(x[:n].clone()))
    onebit = best(lambda: compressed_allreduce(comm, x, worker, server, BLOCK, n))
    if rank == 0:
        Path(out).write_text(json.dumps({"fp32_all_reduce_s": fp32, "onebit_exchange_s": onebit}))
    dist.barrier()  # every rank done before any tears down (gloo's teardown can abort otherwise)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--updates", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2, help="1-bit Adam's AdamW steps")
    ap.add_argument("--n", type=int, default=64, help="paths per group (4 groups)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--tiny", action="store_true", help="the demo's tiny model (a smoke run)")
    ap.add_argument("--rank-run", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_run:
        return rank_run(json.loads(args.rank_run))
    import torch.multiprocessing as mp

    from demo.model import create_tiny_model
    from services.learner.model.deepspeed_engine import free_port

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = str(create_tiny_model(tmp / "model", **({} if args.tiny else MODEL)))
        runs = {name: run_optimizer(name, model, args, tmp) for name in ("adamw", "onebit_adam")}
        n = runs["adamw"]["params"]
        mp.spawn(
            exchange_rank, args=(args.ranks, free_port(), n, str(tmp / "x.json")), nprocs=args.ranks
        )
        exchange = json.loads((tmp / "x.json").read_text())
    adamw = summary(runs["adamw"], args.warmup, False)
    adamw["bytes_per_rank"] = 2 * (args.ranks - 1) * 4 * n // args.ranks  # ring, fp32
    onebit = summary(runs["onebit_adam"], args.warmup, True)
    result = {
        "bench": "onebit_adam",
        "params": n,
        "ranks": args.ranks,
        "backend": "gloo",
        "paths_per_update": 4 * args.n,
        "adamw": adamw,
        "onebit_adam": onebit,
        "exchange": exchange,
        "targets": {
            "bytes_ratio": onebit["bytes_ratio"],
            "bytes_ok": onebit["bytes_ratio"] <= 1 / 20,
        },
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
