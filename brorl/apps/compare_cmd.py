"""``brorl compare``: learner options side by side on the demo task, over several seeds —
through the real services (one local cluster, runs one after another on the same learner).

A config names its arms, each a set of run-config overrides over the recipe's run (e.g.
``train.estimator: ppo``, or ``async.publish_lag: 2``); every arm runs ``steps`` learner steps
from the same cached warm-start for every seed (so every arm trains on the same number of
paths), and is evaluated (held-out greedy accuracy) on its published weight versions at
``eval_points`` evenly spaced steps. Reported per arm: accuracy at equal samples (the last
point), accuracy at equal wall-clock (each run's accuracy-vs-seconds curve, warm-start at 0 s,
read at the mean wall-clock of the fastest arm), samples/s, learner seconds per step and the
measured staleness. configs/algorithms.yaml and configs/staleness.yaml are the two comparisons
of docs/algorithms.md.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from pydantic import Field

from brorl.apps import recipe
from brorl.apps.cluster.launcher import REPO_ROOT, Cluster
from brorl.apps.progress import run_to_end
from brorl.client import LearnerClient
from brorl.config.base import deep_merge


class CompareConfig(recipe.RecipeConfig):
    """A comparison's config (over configs/demo.yaml): its arms, seeds and run length."""

    arms: dict[str, dict] = Field(
        ..., min_length=1, description="Arm name -> run-config overrides over the recipe's run."
    )
    seeds: list[int] = Field([0, 1, 2], description="Seeds (learner seed and prompt order).")
    steps: int = Field(20, ge=1, description="Learner steps of every run.")
    eval_points: int = Field(4, ge=1, description="Evaluations per run, evenly spaced.")
    title: str = Field("", description="The table's heading.")
    out: str = Field("docs/algorithms", description="Where results, table and plot go.")


def add_arguments(p) -> None:
    recipe.add_arguments(
        p,
        recipe.CONFIGS / "algorithms.yaml",
        REPO_ROOT / ".cache" / "compare",
        "overrides, e.g. seeds=[0] steps=5",
        50260,
    )


def eval_steps(steps: int, points: int) -> list[int]:
    return sorted({max(1, round(steps * (k + 1) / points)) for k in range(points)})


def summarize(metrics: list[dict], curve: list[dict]) -> dict:
    """A run's row from its metrics.jsonl and its [{step, accuracy}] curve (gains the
    seconds from the run's start to each evaluated step)."""
    start = next(m["time"] for m in metrics if m.get("event") == "start")
    steps = {m["step"]: m for m in metrics if "learner/loss" in m}
    last = steps[max(steps)]
    elapsed = last["time"] - start
    for point in curve:
        point["seconds"] = steps[point["step"]]["time"] - start
    mean = lambda key: statistics.fmean(m.get(key, 0.0) for m in steps.values())  # noqa: E731
    generated = last.get("rollout/generated", 0)
    return {
        "wall_s": elapsed,
        "generated": generated,
        "samples_per_s": generated / elapsed if elapsed else 0.0,
        "update_s": mean("learner/update_s"),
        "staleness": mean("learner/staleness_mean"),
        "dropped_stale": last.get("learner/dropped_stale", 0.0),
        "eur": mean("explore/eur"),
    }


def accuracy_at(curve: list[dict], seconds: float, start_acc: float) -> float:
    """The accuracy-vs-seconds curve (warm-start at 0 s) read at ``seconds``, linearly
    interpolated; past the curve's end: its last point."""
    pts = [(0.0, start_acc)] + [(p["seconds"], p["accuracy"]) for p in curve]
    for (t0, a0), (t1, a1) in zip(pts, pts[1:]):
        if seconds <= t1:
            return a0 + (a1 - a0) * (seconds - t0) / (t1 - t0) if t1 > t0 else a1
    return pts[-1][1]


def run_compare(args) -> int:
    cfg = recipe.load_recipe(CompareConfig, args.config, args.overrides)
    recipe.require_task(cfg, "addition", "compare")
    work = Path(args.workdir).resolve()
    out = (REPO_ROOT / cfg.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    inputs = recipe.prepare_inputs(cfg, work)
    runs = [(arm, seed) for arm in cfg.arms for seed in cfg.seeds]
    print(f"compare: {len(runs)} runs ({list(cfg.arms)} x seeds {cfg.seeds})")
    print(f"warm-start accuracy {inputs.accuracy:.1%}")
    spec = recipe.study_cluster_spec(cfg, inputs, work, args, "compare")
    points = eval_steps(cfg.steps, cfg.eval_points)
    results, started, stamp = [], time.time(), time.strftime("%Y%m%d-%H%M%S")
    with Cluster(spec) as cluster:
        client = LearnerClient(cluster.learner_address)
        for i, (arm, seed) in enumerate(runs):
            per_run = {
                "data": {"shuffle_seed": seed},
                "train": {"steps": cfg.steps, "seed": seed},
                "async": {"publish_every": 1},
            }
            rc = recipe.build_run_config(
                cfg, inputs, deep_merge(cfg.arms[arm], per_run), recipe.env_address(spec)
            )
            run_id = f"compare-{stamp}-{arm}-s{seed}"
            run_dir, metrics = run_to_end(client, recipe.run_config_yaml(rc), run_id)
            acc = recipe.eval_versions(
                Path(run_dir) / "weights", inputs.model, points, cfg.eval_problems
            )
            curve = [{"step": s, "accuracy": acc[s]} for s in points]
            row = {"arm": arm, "seed": seed, **summarize(metrics, curve), "curve": curve}
            row["accuracy_final"] = acc[points[-1]]
            results.append(row)
            print(
                f"[{i + 1}/{len(runs)}] {arm:14s} seed={seed} acc={row['accuracy_final']:.1%} "
                f"{row['wall_s']:.0f} s ({(time.time() - started) / 60:.1f} min)",
                flush=True,
            )
        client.close()
    report = {
        "config": cfg.model_dump(),
        "warmstart_accuracy": inputs.accuracy,
        "runs": results,
        "wall_minutes": (time.time() - started) / 60,
        "command": f"brorl compare --config {args.config} " + " ".join(args.overrides),
    }
    add_equal_wall(report)
    (out / "results.json").write_text(json.dumps(report, indent=1))
    write_table(report, out / "table.md")
    write_plot(report, out / "accuracy.png")
    print(f"wrote {out}/results.json, table.md, accuracy.png in {report['wall_minutes']:.1f} min")
    return 0


def add_equal_wall(report: dict) -> None:
    """The equal wall-clock budget (the fastest arm's mean run time) and every run's accuracy
    at it."""
    arms = list(report["config"]["arms"])
    walls = [statistics.fmean(r["wall_s"] for r in report["runs"] if r["arm"] == a) for a in arms]
    budget = min(walls)
    report["equal_wall_s"] = budget
    for r in report["runs"]:
        r["accuracy_equal_wall"] = accuracy_at(r["curve"], budget, report["warmstart_accuracy"])


def write_table(report: dict, path: Path) -> None:
    cfg, start = report["config"], report["warmstart_accuracy"]
    lines = [
        f"{cfg['title'] or 'Comparison'}: warm-start held-out accuracy {start:.3f}; "
        f"{cfg['steps']} steps per run; mean ± std over seeds {cfg['seeds']}; equal wall-clock "
        f"= {report['equal_wall_s']:.0f} s (the fastest arm's mean run time).",
        "",
        "| arm | gain, equal samples | gain, equal wall-clock | held-out acc (final) | "
        "samples/s | learner s/step | staleness (versions) | run s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in cfg["arms"]:
        rows = [r for r in report["runs"] if r["arm"] == arm]
        if not rows:
            continue
        lines.append(
            f"| {arm} | {recipe.mean_std([r['accuracy_final'] - start for r in rows])} | "
            f"{recipe.mean_std([r['accuracy_equal_wall'] - start for r in rows])} | "
            f"{recipe.mean_std([r['accuracy_final'] for r in rows])} | "
            f"{recipe.mean_std([r['samples_per_s'] for r in rows], 0)} | "
            f"{recipe.mean_std([r['update_s'] for r in rows], 2)} | "
            f"{recipe.mean_std([r['staleness'] for r in rows], 2)} | "
            f"{recipe.mean_std([r['wall_s'] for r in rows], 0)} |"
        )
    path.write_text("\n".join(lines) + "\n")


def write_plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    start = report["warmstart_accuracy"]
    for arm in report["config"]["arms"]:
        rows = [r for r in report["runs"] if r["arm"] == arm]
        if not rows:
            continue
        n = len(rows[0]["curve"])
        mean = lambda key: [  # noqa: E731
            statistics.fmean(r["curve"][i][key] for r in rows) for i in range(n)
        ]
        acc = [start] + mean("accuracy")
        axes[0].plot([0] + mean("step"), acc, marker="o", label=arm)
        axes[1].plot([0] + mean("seconds"), acc, marker="o", label=arm)
    for ax, xlabel in zip(axes, ("learner steps (equal samples)", "seconds (mean over seeds)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out greedy accuracy")
        ax.legend(fontsize=8)
    axes[1].axvline(report["equal_wall_s"], color="grey", linestyle=":")
    fig.suptitle(report["config"]["title"] or "comparison")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
