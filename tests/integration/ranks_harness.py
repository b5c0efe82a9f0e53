"""Runs 3 policy updates on fixed groups with R learner ranks through the real rank machinery
(start_ranks → RankGroup → DistributedPolicy; the other ranks run services.learner.ranks.follow)
and writes rank 0's weights:

    python -m tests.integration.ranks_harness MODEL_DIR OUT_DIR --ranks 2 --zero 1 [--die-at 2]
        [--estimator ppo] [--optimizer onebit_adam --freeze 1] [--updates 5 --checkpoint-at 3]
        [--resume CKPT_DIR]

``--die-at K``: rank 1 kills itself (SIGKILL) at update K, to test what rank 0 does then; rank 0
writes the error it got to OUT_DIR/error.txt. ``--checkpoint-at K``: a checkpoint after update
K in OUT_DIR/ckpt; ``--resume DIR``: load DIR's checkpoint first and go on from its update (the
groups of update k are the same in every run). With ``--optimizer onebit_adam``, rank 0's bytes
sent per update (by collective) go to OUT_DIR/comm.json.

The tests start it with ``launch`` (a process of its own) and read what it wrote with
``weights``; ``Runs`` keeps each successful run's output for the session (the
``harness_runs`` fixture), so that the tests asking for the same run share one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def launch(
    model, out, ranks=1, zero=0, die_at=0, timeout_s=240, estimator="grpo", extra=()
) -> subprocess.CompletedProcess:
    """This harness in a process of its own; ``extra``: more of its flags."""
    cmd = [sys.executable, "-m", "tests.integration.ranks_harness", str(model), str(out)]
    cmd += ["--ranks", str(ranks), "--zero", str(zero), "--die-at", str(die_at)]
    cmd += ["--estimator", estimator, *map(str, extra)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)


def weights(directory):
    """The weights a run wrote (or a model directory's), by name: CPU tensors."""
    from safetensors.torch import load_file

    return load_file(str(Path(directory) / "model.safetensors"))


def max_diff(a, b) -> float:
    """The largest |a - b| over the tensors of ``a`` (two ``weights`` results)."""
    return max((a[k] - b[k]).abs().max().item() for k in a)


class Runs:
    """Successful runs of the harness by their settings, each run once: ``get`` returns the
    output directory of the run with those settings, running it the first time it is asked
    for (a failed run is not kept: the test that asked fails with its stderr)."""

    def __init__(self, model, root: Path):
        self.model, self.root, self.done = model, Path(root), {}

    def get(self, ranks=1, zero=0, estimator="grpo", extra=()) -> Path:
        key = (ranks, zero, estimator, tuple(map(str, extra)))
        if key not in self.done:
            out = self.root / f"run{len(self.done)}"
            proc = launch(self.model, out, ranks=ranks, zero=zero, estimator=estimator, extra=extra)
            assert proc.returncode == 0, proc.stderr[-3000:]
            self.done[key] = out
        return self.done[key]


def groups(step: int):
    """Irregular groups: sizes 5, 3, 6; completions of 1-4 tokens; mixed rewards."""
    from brorl.v1 import common_pb2

    out = []
    for k, size in enumerate((5, 3, 6)):
        g = common_pb2.PathGroup(group_id=f"g{step}.{k}", prompt_token_ids=[3, 4 + k, 5])
        for i in range(size):
            n = 1 + (i + k + step) % 4
            g.paths.add(
                path_id=f"{g.group_id}/{i}",
                token_ids=[6 + (i * 7 + j + k) % 12 for j in range(n)],
                logprobs=[-2.0 - 0.1 * j for j in range(n)],
                reward=float((i + step) % 3 == 0) + 0.25 * k,
                sampling=common_pb2.SamplingParams(n=size, temperature=1.0, top_k=-1, top_p=1.0),
            )
        out.append(g)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--zero", type=int, default=0)
    ap.add_argument("--die-at", type=int, default=0)
    ap.add_argument("--estimator", default="grpo")
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--optimizer", default="adamw")
    ap.add_argument("--freeze", type=int, default=100, help="1-bit Adam's warm-up steps")
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--checkpoint-at", type=int, default=0)
    ap.add_argument("--resume", default="")
    ap.add_argument("--prompt-per-chunk", action="store_true", help="train.prompt_once off")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    from brorl.config.run import RunConfig
    from services.learner import ranks
    from services.learner.server import make_policy

    cfg = RunConfig.model_validate(
        {
            "model": args.model,
            "data": {"train_path": "unused"},
            # micro-batches of 2 paths: 8 chunks a step, split over the ranks unevenly
            "train": {
                "lr": 2e-3,
                "micro_batch_paths": 2,
                "seed": 3,
                "estimator": args.estimator,
                "optimizer": args.optimizer,
                "onebit_freeze_steps": args.freeze,
                "ppo": {"epochs": 2, "minibatches": 3},  # under ppo: 6 optimizer steps a step
                "prompt_once": not args.prompt_per_chunk,
            },
        }
    )
    make = make_policy(args.zero)
    children = ranks.start_ranks(args.ranks, args.timeout) if args.ranks > 1 else []
    rank = int(os.environ.get("RANK", "0"))
    if rank > 0:
        if args.die_at:
            _die_at_update(args.die_at, Path(args.out))
        ranks.follow(make)
        return 0
    group = ranks.RankGroup(args.ranks, children, args.timeout / 4) if args.ranks > 1 else None
    policy = ranks.DistributedPolicy(group, cfg, make) if group else make(cfg)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        _updates(policy, args, out)
        from safetensors.numpy import save_file

        save_file(policy.weights(), str(out / "model.safetensors"))
        shutil.copy(Path(args.model) / "config.json", out / "config.json")
    except ranks.RankFailure as exc:
        (out / "error.txt").write_text(str(exc))
        return 3
    finally:
        if group:
            group.close()
    return 0


def _updates(policy, args, out: Path) -> None:
    """Updates ``start`` .. ``args.updates - 1`` (start: 0, or the resumed checkpoint's)."""
    start = int(policy.load_checkpoint(args.resume)["update"]) if args.resume else 0
    comm = []
    for step in range(start, args.updates):
        sent = _bytes_sent(policy)
        policy.update(groups(step))
        if sent is not None:
            comm.append({k: v - sent.get(k, 0) for k, v in _bytes_sent(policy).items()})
        if step + 1 == args.checkpoint_at:
            policy.save_checkpoint(str(out / "ckpt"), f"update{step + 1}", {"update": step + 1})
    if comm:
        (out / "comm.json").write_text(json.dumps(comm))


def _bytes_sent(policy) -> dict | None:
    """Rank 0's 1-bit Adam byte counters (None with another optimizer)."""
    local = getattr(policy, "local", policy)
    comm = getattr(local.engine.optimizer, "comm", None)
    return dict(comm.sent) if comm is not None else None


def _die_at_update(k: int, out: Path) -> None:
    """Rank 1 SIGKILLs itself when the k-th update command arrives (the time in
    OUT_DIR/killed_at)."""
    from services.learner import ranks

    real, seen = ranks.unpack_groups, [0]

    def counting(data):
        seen[0] += 1
        if seen[0] == k:
            out.mkdir(parents=True, exist_ok=True)
            (out / "killed_at").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        return real(data)

    ranks.unpack_groups = counting


if __name__ == "__main__":
    sys.exit(main())
