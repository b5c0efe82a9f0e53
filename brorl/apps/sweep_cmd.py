"""``brorl sweep``: what widening N does on the demo task, at equal generated samples and at
equal learner steps, over several seeds — through the real services (one local cluster, runs
one after another on the same learner).

For every (regime, N, seed) it runs RL from the same warm-start, evaluates held-out greedy
accuracy at a few points of the run (the published weight versions), and collects from the
run's metrics: samples/s, gradient-norm mean and spread, advantage spread, EUR. It writes
``docs/sweep/results.json``, ``docs/sweep/table.md`` and plots (``docs/sweep/*.png``).

Warm-start, prompt set, cluster and the base run config follow the recipe shared with
``brorl demo`` (brorl/apps/recipe.py): configs/sweep.yaml names configs/demo.yaml as its base.
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


class SweepConfig(recipe.RecipeConfig):
    """configs/sweep.yaml: the recipe (from its base, configs/demo.yaml) and what the sweep
    varies."""

    ns: list[int] = Field([16, 64, 256, 512], description="Group sizes N compared.")
    seeds: list[int] = Field([0, 1, 2], description="Seeds (learner seed and prompt order).")
    equal_steps: int = Field(
        30, ge=1, description="Learner steps of every run in the equal-steps regime."
    )
    sample_budget: int = Field(
        15360,
        ge=16,
        description=(
            "Paths sampled for the updates of a run in the equal-samples regime "
            "(steps = budget / (N x groups_per_step))."
        ),
    )
    eval_points: int = Field(
        3, ge=1, description="Evaluations per run, evenly spaced over its steps."
    )
    out: str = Field(
        "docs/sweep", description="Where results, table and plots go (relative to the repo)."
    )


def add_arguments(p) -> None:
    recipe.add_arguments(
        p,
        recipe.CONFIGS / "sweep.yaml",
        REPO_ROOT / ".cache" / "sweep",
        "sweep config overrides, e.g. ns=[16,64] seeds=[0]",
        50160,
    )



def plan(cfg: SweepConfig) -> list[dict]:
    """Every (regime, N, seed) run with its learner steps, in the order they run."""
    per_step = int(cfg.run.get("train", {}).get("groups_per_step", 1))  # prompts per update
    runs = []
    for regime in ("equal_steps", "equal_samples"):
        for n in cfg.ns:
            steps = (
                cfg.equal_steps
                if regime == "equal_steps"
                else max(1, cfg.sample_budget // (n * per_step))
            )
            for seed in cfg.seeds:
                runs.append({"regime": regime, "n": n, "seed": seed, "steps": steps})
    return runs


def summarize(run: dict, metrics: list[dict]) -> dict:
    """One row of the report from a run's metrics.jsonl."""
    steps = [m for m in metrics if "learner/loss" in m]
    grad = [m["learner/grad_norm"] for m in steps]
    adv = [m.get("learner/adv_std", 0.0) for m in steps]
    elapsed = (metrics[-1]["time"] - metrics[0]["time"]) if len(metrics) > 1 else 0.0
    generated = steps[-1].get("rollout/generated", 0) if steps else 0
    return {
        **run,
        "generated": generated,
        "samples_per_s": generated / elapsed if elapsed else 0.0,
        "wall_s": elapsed,
        "grad_norm_mean": statistics.fmean(grad) if grad else 0.0,
        "grad_norm_std": statistics.pstdev(grad) if len(grad) > 1 else 0.0,
        "adv_std_mean": statistics.fmean(adv) if adv else 0.0,
        "eur_mean": statistics.fmean(m.get("explore/eur", 0.0) for m in steps) if steps else 0.0,
    }


def per_run_config(run: dict) -> dict:
    """What one (regime, N, seed) run sets over the recipe's run config."""
    return {
        "data": {"shuffle_seed": run["seed"]},
        "sampling": {"n": run["n"]},
        "train": {"steps": run["steps"], "seed": run["seed"]},
        "async": {"publish_every": 1},
    }


def run_sweep(args) -> int:
    cfg = recipe.load_recipe(SweepConfig, args.config, args.overrides)
    recipe.require_task(cfg, "addition", "sweep")
    work = Path(args.workdir).resolve()
    out = (REPO_ROOT / cfg.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    inputs = recipe.prepare_inputs(cfg, work)
    runs = plan(cfg)
    print(
        f"sweep: {len(runs)} runs (N in {cfg.ns}, seeds {cfg.seeds}); "
        f"warm-start accuracy {inputs.accuracy:.1%}"
    )
    spec = recipe.study_cluster_spec(cfg, inputs, work, args, "sweep")
    results = []
    started = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with Cluster(spec) as cluster:
        client = LearnerClient(cluster.learner_address)
        for i, run in enumerate(runs):
            rc = recipe.build_run_config(
                cfg, inputs, per_run_config(run), recipe.env_address(spec)
            )
            run_id = f"sweep-{stamp}-{run['regime']}-n{run['n']}-s{run['seed']}"
            run_dir, metrics = run_to_end(client, recipe.run_config_yaml(rc), run_id)
            run_dir = Path(run_dir)
            points = sorted(
                {
                    max(1, round(run["steps"] * (k + 1) / cfg.eval_points))
                    for k in range(cfg.eval_points)
                }
            )
            acc = recipe.eval_versions(run_dir / "weights", inputs.model, points, cfg.eval_problems)
            row = summarize(run, metrics)
            per_step = rc.train.groups_per_step * run["n"]
            row["accuracy_curve"] = [
                {"step": s, "samples": s * per_step, "accuracy": acc[s]} for s in points
            ]
            row["accuracy_final"] = acc[points[-1]]
            results.append(row)
            print(
                f"[{i + 1}/{len(runs)}] {run['regime']:13s} N={run['n']:4d} seed={run['seed']} "
                f"steps={run['steps']:4d} "
                f"acc={row['accuracy_final']:.1%} samples/s={row['samples_per_s']:.0f} "
                f"({(time.time() - started) / 60:.1f} min)",
                flush=True,
            )
        client.close()
    report = {
        "config": cfg.model_dump(),
        "warmstart_accuracy": inputs.accuracy,
        "runs": results,
        "wall_minutes": (time.time() - started) / 60,
        "command": "brorl sweep " + " ".join(args.overrides),
    }
    (out / "results.json").write_text(json.dumps(report, indent=1))
    write_table(report, out / "table.md")
    write_plots(report, out)
    print(f"wrote {out}/results.json, table.md and plots in {report['wall_minutes']:.1f} min")
    return 0


def write_table(report: dict, path: Path) -> None:
    lines = [
        f"Warm-start held-out accuracy: {report['warmstart_accuracy']:.3f}. "
        f"Mean ± std over seeds {report['config']['seeds']}.",
        "",
        "`generated` counts every sampled path, including groups skipped because all their rewards "
        "were equal; the equal-samples budget counts the paths that entered updates.",
        "",
        (
            "| regime | N | steps | generated | held-out acc (final) | samples/s | "
            "grad-norm mean | grad-norm std (over steps) | adv std | EUR |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for regime in ("equal_steps", "equal_samples"):
        for n in report["config"]["ns"]:
            rows = [r for r in report["runs"] if r["regime"] == regime and r["n"] == n]
            if not rows:
                continue
            lines.append(
                f"| {regime} | {n} | {rows[0]['steps']} | {rows[0]['generated']:.0f} | "
                f"{recipe.mean_std([r['accuracy_final'] for r in rows])} | "
                f"{recipe.mean_std([r['samples_per_s'] for r in rows])} | "
                f"{recipe.mean_std([r['grad_norm_mean'] for r in rows])} | "
                f"{recipe.mean_std([r['grad_norm_std'] for r in rows])} | "
                f"{recipe.mean_std([r['adv_std_mean'] for r in rows])} | "
                f"{recipe.mean_std([r['eur_mean'] for r in rows])} |"
            )
    path.write_text("\n".join(lines) + "\n")


def write_plots(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for regime, x_key, xlabel in (
        ("equal_samples", "samples", "paths in updates (N x prompts per step x steps)"),
        ("equal_steps", "step", "learner steps"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        for n in report["config"]["ns"]:
            rows = [r for r in report["runs"] if r["regime"] == regime and r["n"] == n]
            if not rows:
                continue
            xs = [p[x_key] for p in rows[0]["accuracy_curve"]]
            ys = [
                statistics.fmean(r["accuracy_curve"][i]["accuracy"] for r in rows)
                for i in range(len(xs))
            ]
            ax.plot([0] + xs, [report["warmstart_accuracy"]] + ys, marker="o", label=f"N={n}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out greedy accuracy")
        ax.set_title(f"{regime.replace('_', ' ')} (mean over seeds)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"accuracy_{regime}.png", dpi=100)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for regime in ("equal_steps", "equal_samples"):
        ns = [
            n
            for n in report["config"]["ns"]
            if any(r["regime"] == regime and r["n"] == n for r in report["runs"])
        ]
        ax.plot(
            ns,
            [
                statistics.fmean(
                    r["grad_norm_std"]
                    for r in report["runs"]
                    if r["regime"] == regime and r["n"] == n
                )
                for n in ns
            ],
            marker="o",
            label=f"grad-norm std, {regime.replace('_', ' ')}",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N (paths per prompt)")
    ax.set_ylabel("std of gradient norm over steps")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "gradient_spread.png", dpi=100)
    plt.close(fig)
