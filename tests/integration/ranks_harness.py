"""Runs 3 policy updates on fixed groups with R learner ranks through the real rank machinery
(start_ranks → RankGroup → DistributedPolicy; the other ranks run services.learner.ranks.follow)
and writes rank 0's weights:

    python -m tests.integration.ranks_harness MODEL_DIR OUT_DIR --ranks 2 --zero 1 [--die-at 2]
        [--estimator ppo]

``--die-at K``: rank 1 kills itself (SIGKILL) at update K, to test what rank 0 does then; rank 0
writes the error it got to OUT_DIR/error.txt.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
from pathlib import Path


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
                "ppo": {"epochs": 2, "minibatches": 3},  # under ppo: 6 optimizer steps a step
            },
        }
    )
    make = make_policy(args.zero)
    children = ranks.start_ranks(args.ranks, args.timeout) if args.ranks > 1 else []
    rank = int(os.environ.get("RANK", "0"))
    if rank > 0:
        if args.die_at:
            _die_at_update(args.die_at)
        ranks.follow(make)
        return 0
    group = ranks.RankGroup(args.ranks, children, args.timeout / 4) if args.ranks > 1 else None
    policy = ranks.DistributedPolicy(group, cfg, make) if group else make(cfg)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        for step in range(3):
            policy.update(groups(step))
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


def _die_at_update(k: int) -> None:
    """Rank 1 SIGKILLs itself when the k-th update command arrives."""
    from services.learner import ranks

    real, seen = ranks.unpack_groups, [0]

    def counting(data):
        seen[0] += 1
        if seen[0] == k:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(data)

    ranks.unpack_groups = counting


if __name__ == "__main__":
    sys.exit(main())
