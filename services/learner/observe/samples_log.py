"""Sample completions in the run directory: every ``samples_every`` steps, the step's best, worst
and one random path (prompt, completion text, reward) as one line of ``samples.jsonl``.

Metrics say how the rewards move; only the completions say *what* the policy learned (the demo's
policy, for one, stops zero-padding its answers). ``brorl report`` shows them as a table. Three
paths a step keep the file small at any N; texts are cut at ``MAX_CHARS``.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

from brorl.v1 import common_pb2

FILENAME = "samples.jsonl"
KINDS = ("best", "worst", "random")
MAX_CHARS = 2000  # per text: N paths of long completions must not grow the file by N x length


def choose_samples(groups: list[common_pb2.PathGroup], step: int) -> list[dict]:
    """The best, worst and a random path over all paths of ``groups`` (non-finite rewards left
    out), each as a record; [] when there is no path. Ties go to the earliest path."""
    candidates = [(g, p) for g in groups for p in g.paths if math.isfinite(p.reward)]
    if not candidates:
        return []
    best = max(candidates, key=lambda gp: gp[1].reward)
    worst = min(candidates, key=lambda gp: gp[1].reward)
    # Its own generator, seeded by the step: the global one is saved in every checkpoint
    # (train.rng_state) and drawing from it here would change what a resumed run samples.
    drawn = random.Random(step).choice(candidates)
    return [_record(kind, *gp) for kind, gp in zip(KINDS, (best, worst, drawn))]


def _cut(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + "…"


def _record(kind: str, group: common_pb2.PathGroup, path: common_pb2.Path) -> dict:
    return {
        "kind": kind,
        "reward": float(path.reward),
        "group_id": group.group_id,
        "prompt": _cut(group.prompt),
        "reference": _cut(group.reference),
        "text": _cut(path.text),
        "tokens": len(path.token_ids),
        "finish_reason": path.finish_reason,
        "weight_version": int(path.weight_version),
    }


def write_samples(
    run_dir: Path, step: int, groups: list[common_pb2.PathGroup], every: int
) -> list[dict]:
    """Append the step's samples to ``run_dir/samples.jsonl`` when ``step`` is a multiple of
    ``every`` (0: never), and return them ([] when none were written). A resumed run writes its
    repeated steps again; readers keep the last."""
    if every <= 0 or step % every:
        return []
    samples = choose_samples(groups, step)
    if not samples:
        return []
    line = json.dumps({"step": step, "time": time.time(), "samples": samples})
    with open(Path(run_dir) / FILENAME, "a") as f:
        f.write(line + "\n")
    return samples


def samples_markdown(samples: list[dict]) -> str:
    """A step's sample records (choose_samples) as one markdown table."""
    rows = ["| kind | reward | prompt | completion |", "|---|---|---|---|"]
    for s in samples:
        cells = (s["kind"], f"{s['reward']:.4g}", s["prompt"], s["text"])
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows)


def _cell(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")
