"""The learner's policy update at the demo's settings: paths/s of this checkout, optionally
against another git revision measured in the same run, and achieved FLOP/s ÷ a peak GEMM
FLOP/s measured in the same run. Prints ONE JSON object.

    python bench/learner_update.py [--baseline REV] [--groups 4] [--n 512] [--threads 1]

The workload is the demo's shape: the demo's tiny Qwen2 (0.8 M parameters, random weights),
``--groups`` groups of ``--n`` paths, a 6-token prompt per group, completions of 2-6 tokens,
rewards 0/1, temperature 1, no top-k/top-p, and each revision's own ``micro_batch_paths``
from its configs/demo.yaml unless ``--micro-batch`` is given. ``--shape long`` takes the
realistic shape's instead (demo/long_shape.py: its 24 M model, 2 groups of 64 paths, a 146-token
prompt, completions of 40-48 tokens, micro-batches of 32, ``autocast native``); a flag given
still wins. Each revision runs in its own
subprocess (its own checkout on ``sys.path``); revisions alternate ``--repeats`` times and the
best time of each counts (the machine is shared: the minimum is the least disturbed run).

FLOPs: 6 × parameters × token positions actually run forward and backward, the work a dense
transformer does per token; the same formula for both revisions, so their ratio of
achieved FLOP/s is the ratio of useful work per second only where their token counts agree.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the printed object's documented keys (tests/unit/bench/test_bench_smoke.py checks them)
KEYS = ("bench", "parameters", "peak_gemm_flops", "current.seconds_per_update",
        "current.paths_per_s", "current.achieved_over_peak")  # fmt: skip

# Runs inside a checkout: times that checkout's update on synthetic demo-shaped groups.
RUNNER = r"""
import json, os, random, sys, time
import torch
torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
from brorl.config.train import TrainConfig
from brorl.v1 import common_pb2
args = json.loads(sys.argv[1])
rng = random.Random(0)
groups = []
for g in range(args["groups"]):
    prompt = [1] + [rng.randrange(4, 14) for _ in range(args.get("prompt_tokens", 6) - 1)]
    group = common_pb2.PathGroup(group_id=f"g{g}", prompt_token_ids=prompt)
    lo, hi = args.get("completion_tokens", (2, 6))
    for i in range(args["n"]):
        toks = [rng.randrange(4, 21) for _ in range(rng.randint(lo, hi))]
        group.paths.add(path_id=f"g{g}/{i}", token_ids=toks, logprobs=[-1.0] * len(toks),
                        reward=float(rng.random() < 0.5), sampling=common_pb2.SamplingParams(
                            n=args["n"], temperature=1.0, top_k=-1, top_p=1.0, max_tokens=6))
    groups.append(group)
# the run's optimizer steps per update (bench/e2e.py passes its recipe's epochs and minibatches);
# only when not 1, so a --baseline revision whose TrainConfig lacks them still runs
fields = {k: args[k] for k in ("epochs", "minibatches") if args.get(k, 1) != 1}
# the forward's dtype likewise only when not the default (train.autocast)
if args.get("autocast", "auto") != "auto":
    fields["autocast"] = args["autocast"]
if args.get("estimator", "grpo") != "grpo":  # ppo: a critic, and train.ppo's passes
    fields["estimator"] = args["estimator"]
train = TrainConfig(lr=2e-4, micro_batch_paths=args["micro_batch"], **fields)
try:
    from services.learner.model.policy import Policy
    policy = Policy(args["model"], train)
    update = policy.update
except ImportError:   # a revision before the Policy class: Trainer.update did the update
    from collections import Counter
    from transformers import AutoModelForCausalLM
    from services.learner import strategy
    from services.learner.train import Trainer
    from brorl.config.run import RunConfig
    t = object.__new__(Trainer)
    t.cfg = RunConfig.model_validate({"model": args["model"], "data": {"train_path": "-"},
                                      "train": train.model_dump()})
    model = AutoModelForCausalLM.from_pretrained(args["model"], dtype=torch.float32)
    t.engine, t.pad_id, t.ref_model = strategy.build_engine(model, train, 0), 0, None
    t.counters, t._last_group, t._generated_since_update = Counter(), {}, 0
    update = t.update
update(groups)   # warm-up: allocator, first-call paths
times, compute = [], []
for _ in range(args["steps"]):
    start = time.perf_counter()
    stats = update(groups)
    times.append(time.perf_counter() - start)
    # forward + backward + optimizer, the phases the pipeline's FLOP/s count (bench/e2e.py)
    compute.append(sum(stats.get(f"learner/{k}_s", 0.0) for k in ("forward", "backward",
                                                                   "optimizer")))
# token positions run forward and backward (the old flat batch padded every path to the longest)
longest = max(len(g.prompt_token_ids) + len(p.token_ids) for g in groups for p in g.paths)
positions = stats.get("learner/positions", sum(len(g.paths) for g in groups) * longest)
print(json.dumps({"seconds": times, "compute_seconds": compute,
                  "tokens": float(stats.get("learner/tokens", 0)), "positions": float(positions),
                  "micro_batch": args["micro_batch"]}))
"""


# each shape's settings: run_update's spec where no flag gives one (micro_batch 0: the demo's)
SHAPES = {
    "demo": {"groups": 4, "n": 512, "micro_batch": 0, "autocast": "auto"},
    "long": {
        "groups": 2,
        "n": 64,
        "micro_batch": 32,
        "autocast": "native",
        "prompt_tokens": 146,
        "completion_tokens": (40, 48),
    },
}


def make_model(shape: str, work: Path) -> Path:
    """The shape's model, random weights, under ``work``."""
    if shape == "long":
        from demo import long_shape

        return long_shape.make_inputs(work, n_prompts=1)[0]
    from demo.model import create_tiny_model

    return create_tiny_model(work / "model")


def demo_micro_batch(checkout: Path) -> int:
    """The revision's own demo setting (configs/demo.yaml: run.train.micro_batch_paths)."""
    import yaml

    demo = yaml.safe_load((checkout / "configs" / "demo.yaml").read_text())
    return demo["run"]["train"]["micro_batch_paths"]


def run_update(checkout: Path, model: str, args) -> dict:
    env = {
        **os.environ,
        # the revision's checkout first; the caller's own entries stay (packages installed
        # beside the interpreter's, as scripts/gpu_check.sh does)
        "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")])),
        "BENCH_THREADS": str(args.threads),
        "DS_ACCELERATOR": "cpu",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    spec = {
        "model": model,
        "groups": args.groups,
        "n": args.n,
        "steps": args.steps,
        "micro_batch": args.micro_batch or demo_micro_batch(checkout),
        # the demo's shape unless the caller gives another (bench/e2e.py --shape long)
        "prompt_tokens": getattr(args, "prompt_tokens", 6),
        "completion_tokens": list(getattr(args, "completion_tokens", (2, 6))),
        # optimizer steps per update: one unless the caller's recipe takes several
        "epochs": getattr(args, "epochs", 1),
        "minibatches": getattr(args, "minibatches", 1),
        "autocast": getattr(args, "autocast", "auto"),
        "estimator": getattr(args, "estimator", "grpo"),
    }
    out = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(spec)],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if out.returncode != 0:
        raise SystemExit(f"update in {checkout} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", default="", help="git revision to compare with (e.g. a commit)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="demo", help="the workload")
    p.add_argument("--groups", type=int, default=None, help="default: the shape's")
    p.add_argument("--n", type=int, default=None, help="default: the shape's")
    p.add_argument("--micro-batch", type=int, default=None, help="0: configs/demo.yaml's")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=3, help="timed updates per run")
    p.add_argument(
        "--autocast",
        choices=("auto", "native", "bf16", "fp32"),
        default=None,
        help="train.autocast: the forward's dtype (auto: fp32 on CPU; default: the shape's)",
    )
    p.add_argument("--repeats", type=int, default=2, help="alternating runs per revision")
    p.add_argument(
        "--estimator",
        default="grpo",
        help="train.estimator (ppo: a critic and train.ppo's 4 epochs x 2 mini-batches; the FLOPs "
        "still count one pass of the policy)",
    )
    args = p.parse_args()
    for key, value in SHAPES[args.shape].items():  # the shape's settings where no flag is given
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    sys.path.insert(0, str(REPO))
    from bench.peak import peak_gemm_flops

    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_model(args.shape, Path(tmp)))
        checkouts = {"current": REPO}
        if args.baseline:
            base = Path(tmp) / "baseline"
            subprocess.run(
                [
                    "git",
                    "-C",
                    str(REPO),
                    "worktree",
                    "add",
                    "--detach",
                    "-q",
                    str(base),
                    args.baseline,
                ],
                check=True,
            )
            checkouts["baseline"] = base
        try:
            peak = peak_gemm_flops(args.threads)
            runs: dict[str, list[dict]] = {name: [] for name in checkouts}
            for _ in range(args.repeats):
                for name, checkout in checkouts.items():
                    runs[name].append(run_update(checkout, model, args))
        finally:
            if args.baseline:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)],
                    check=False,
                )
        import torch
        from transformers import AutoModelForCausalLM

        params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model).parameters())
    paths = args.groups * args.n
    result = {
        "bench": "learner_update",
        "shape": args.shape,
        "threads": args.threads,
        "autocast": args.autocast,
        "estimator": args.estimator,
        "groups": args.groups,
        "n": args.n,
        "parameters": params,
        "peak_gemm_flops": peak,
        "torch": torch.__version__,
    }
    for name, rs in runs.items():
        best = min(s for r in rs for s in r["seconds"])
        flops = 6 * params * rs[0]["positions"] / best
        result[name] = {
            "seconds_per_update": best,
            "paths_per_s": paths / best,
            "completion_tokens": rs[0]["tokens"],
            "positions": rs[0]["positions"],
            "micro_batch_paths": rs[0]["micro_batch"],
            "achieved_flops": flops,
            "achieved_over_peak": flops / peak,
        }
    if args.baseline:
        result["baseline"]["revision"] = args.baseline
        result["speedup"] = (
            result["baseline"]["seconds_per_update"] / result["current"]["seconds_per_update"]
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
