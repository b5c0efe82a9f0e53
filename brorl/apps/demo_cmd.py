"""``brorl demo``: the whole system on this CPU, end to end.

1. warm-start the tiny demo model by supervised fine-tuning (cached after the first run),
2. write the RL prompt set and measure the warm-start's held-out greedy accuracy,
3. start reward + K rollout workers + learner as separate processes (and Redis if needed),
4. run RL with N paths per prompt through them, with a progress bar,
5. evaluate the final weights on the same held-out problems and report the gain.

Steps 1-3 and the run config follow the recipe shared with ``brorl sweep`` (brorl/apps/recipe.py);
the demo package (model, task, SFT, evaluation) needs torch, so it runs as subprocesses.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from pydantic import Field

from brorl.apps import recipe, report, tasks
from brorl.apps.cluster.launcher import REPO_ROOT, Cluster
from brorl.apps.progress import watch_run
from brorl.client import LearnerClient
from brorl import cluster

DEFAULT_CONFIG = recipe.CONFIGS / "demo.yaml"


class DemoConfig(recipe.RecipeConfig):
    """configs/demo.yaml: the recipe, with a larger held-out set for the before/after accuracy."""

    eval_problems: int = Field(
        500, ge=200, description="Held-out problems for the before/after greedy accuracy."
    )


def add_arguments(p) -> None:
    recipe.add_arguments(
        p,
        DEFAULT_CONFIG,
        REPO_ROOT / ".cache" / "demo",
        "demo config overrides, e.g. run.train.steps=10 workers=1",
    )
    p.add_argument("--learner-port", type=int, default=cluster.DEFAULT.learner_port)
    p.add_argument("--reward-port", type=int, default=cluster.DEFAULT.reward_port)
    p.add_argument("--rollout-base-port", type=int, default=cluster.DEFAULT.rollout_base_port)
    p.add_argument(
        "--env-port",
        type=int,
        default=cluster.DEFAULT.env_port,
        help="the environment service's port (tasks with one, e.g. task: tooluse)",
    )


def _strata(by_stratum: dict) -> str:
    """The "; by stratum: easy 19.4%, ..." suffix (empty for a task without strata)."""
    if not by_stratum:
        return ""
    return "; by stratum: " + ", ".join(f"{k} {v or 0:.1%}" for k, v in by_stratum.items())


def verdict_lines(before: dict, after: dict, top: int = 4) -> list[str]:
    """Per label, the shares of the commonest verdicts of the greedy answers, warm-start →
    final (``{label: {verdict: share}}`` each): "easy: correct 19.4% → 26.6%, ..."."""
    lines = []
    for label, now in after.items():
        was = before.get(label, {})
        names = sorted(set(was) | set(now), key=lambda v: -max(was.get(v, 0), now.get(v, 0)))
        lines.append(f"{label}: " + ", ".join(
            f"{v} {was.get(v, 0):.1%} → {now.get(v, 0):.1%}" for v in names[:top]
        ))  # fmt: skip
    return lines


def run_demo(args) -> int:
    cfg = recipe.load_recipe(DemoConfig, args.config, args.overrides)
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()

    print("== 1/4 warm-start (supervised fine-tuning; cached after the first run)")
    inputs = recipe.prepare_inputs(cfg, work)
    before = inputs.accuracy
    print(f"   warm-start held-out greedy accuracy: {before:.1%} ({cfg.eval_problems} problems)"
          + _strata(inputs.by_stratum))  # fmt: skip

    workers = f"{cfg.workers} rollout worker{'s' if cfg.workers != 1 else ''}"
    env = f", environment {spec_env}" if (spec_env := tasks.environment(cfg).get("env")) else ""
    print(f"== 2/4 starting the local cluster: reward, {workers}, learner{env}")
    spec = recipe.cluster_spec(
        cfg,
        inputs,
        work,
        redis_url=args.redis_url,
        reward_port=args.reward_port,
        learner_port=args.learner_port,
        rollout_base_port=args.rollout_base_port,
        namespace=f"demo-{os.getpid()}",
        env_port=args.env_port,
    )
    run_cfg = recipe.build_run_config(cfg, inputs, env_address=recipe.env_address(spec))
    run_id = time.strftime("demo-%Y%m%d-%H%M%S")
    launched = time.time()
    with Cluster(spec) as cluster:
        print(f"   cluster ready in {time.time() - launched:.0f}s; logs in {cluster.logs}")
        print("   metrics: " + ", ".join(f"{n} {u}" for n, u in cluster.metrics_urls().items()))
        print(f"== 3/4 RL: {run_cfg.train.steps} steps, N={run_cfg.sampling.n} paths per prompt")
        client = LearnerClient(cluster.learner_address)
        info = client.start(recipe.run_config_yaml(run_cfg), run_id=run_id)
        result = watch_run(client, info.run_id, info.total_steps)
        client.close()
    if result["state"] != "finished":
        print(f"run {result['state']}: {result['message']}", file=sys.stderr)
        return 1
    run_dir = Path(result["run_dir"])
    print("== 4/4 evaluating the final policy")
    final = recipe.evaluate(run_dir / "final", cfg.eval_problems, cfg)
    after = final["accuracy"]
    summary = {
        "run_id": run_id,
        "run_dir": str(run_dir),
        "heldout_problems": cfg.eval_problems,
        "accuracy_warmstart": before,
        "accuracy_final": after,
        "gain_points": 100 * (after - before),
        "accuracy_by_stratum_warmstart": inputs.by_stratum,
        "accuracy_by_stratum_final": final["by_stratum"],
        "verdicts_warmstart": inputs.verdicts,
        "verdicts_final": final["verdicts"],
        "wall_seconds": time.time() - started,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    print(
        f"   held-out greedy accuracy: {before:.1%} → {after:.1%} "
        f"({summary['gain_points']:+.1f} points)"
    )
    if final["by_stratum"]:
        print("   by stratum: " + ", ".join(
            f"{k} {inputs.by_stratum.get(k) or 0:.1%} → {v or 0:.1%}"
            for k, v in final["by_stratum"].items()
        ))  # fmt: skip
    if final["verdicts"]:
        print("   greedy answers by the checker's verdict, warm-start → final:")
        for line in verdict_lines(inputs.verdicts, final["verdicts"]):
            print(f"     {line}")
    print(f"   run directory: {run_dir} (config.yaml, metrics.jsonl, final/, summary.json)")
    print(f"   total {summary['wall_seconds'] / 60:.1f} min")
    # last, so the report has summary.json's before/after accuracy
    print(f"   report (open in a browser): {report.write_report(run_dir)}")
    return 0
