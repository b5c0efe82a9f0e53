"""``brorl study countdown``: BroRL's claim tested on Countdown (issue 23; docs/countdown.md
"The study"). Everything runs through the real services on one local cluster.

1. Inputs: the Countdown warm-start, RL prompts and held-out prompts with their difficulty label
   (brorl/apps/tasks.py), and a probe set of ``probe_label`` problems of the probe split, each
   with one solution, for the learner's probe mass (``demo.countdown.rl probes``).
2. Saturation: one run with N = ``small_n`` that checkpoints every ``eval_every`` steps; the
   driver evaluates each such step's weights (greedy, held-out) and when the plateau rule
   (brorl.apps.plateau) holds at step P the same run goes on as the narrow arm — the same
   process, optimizer state and prompt stream, no restart — until it has generated
   ``sample_budget`` paths since P (or ``saturate_max_steps``: then the study says the plateau
   was not reached).
3. Forks of step P's checkpoint (weights, optimizer state, prompt cursor, counters): copied
   into a new run's directory and resumed with N = ``wide_n`` (every seed) and N = ``small_n``
   (the narrow arm's other seeds), each until ``sample_budget`` paths since P. Prompts per step
   and learning rate are the saturation run's, whatever N (not scaled). Replicates of a fork differ
   by the workers' sampling, which is not seeded.
4. From the warm-start: N in ``warm_ns`` and the adaptive budget (mean ``adaptive_n`` paths a
   group, ``sampling.budget: adaptive``), per seed (``data.shuffle_seed`` = ``train.seed`` =
   seed), each until ``sample_budget`` paths.
5. Afterwards (brorl/apps/countdown_study_report.py reads what this writes): every run's weights
   at ``eval_points`` evenly spaced sample counts and at the wall-clock time of its phase's
   shortest run (greedy held-out accuracy, overall and per label); pass@k of the final policies
   on ``passk_problems`` hard held-out problems; per run, from the learner's counters over its
   window, the share of groups with a success and of all-equal groups per label
   (explore/success_groups/<label>, ...), and the probe mass change per update.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from pydantic import Field

from brorl.apps import countdown_study_report, plateau, recipe
from brorl.apps.cluster.launcher import REPO_ROOT, Cluster
from brorl.apps.study_cmd import SaturationStudyConfig, drive
from brorl.client import LearnerClient


class CountdownStudyConfig(SaturationStudyConfig):
    """configs/countdown_study.yaml (over configs/countdown.yaml): phases, arms and budgets (the
    shared fields: study_cmd.SaturationStudyConfig; ``sample_budget`` counts paths since the
    plateau for its forks and from the start for the warm-start arms)."""

    warm_ns: list[int] = Field([16, 64, 512], description="N of the runs from the warm-start.")
    adaptive_n: int = Field(
        64, ge=0, description="Mean paths a group of the adaptive-budget arm (0: no such arm)."
    )
    adaptive_n_min: int = Field(4, ge=1, description="n_min of the adaptive budget.")
    adaptive_n_max: int = Field(512, ge=1, description="n_max of the adaptive budget.")
    phases: list[str] = Field(
        ["plateau", "warmstart"],
        description="Which comparisons to run: 'plateau' (saturation, then narrow vs wide "
        "forks) and/or 'warmstart' (warm_ns and the adaptive arm from the warm-start).",
    )
    probe_label: str = Field("hard", description="Difficulty label of the probes ('': any).")


def add_arguments(p) -> None:
    """``p``: the parser of ``brorl study countdown``."""
    recipe.add_arguments(
        p,
        recipe.CONFIGS / "countdown_study.yaml",
        REPO_ROOT / ".cache" / "countdown_study",
        "study config overrides, e.g. seeds=[0] sample_budget=16384",
        50360,
    )


def arm_config(cfg, inputs, probes: Path, n: int, seed: int, extra: dict | None = None):
    """A run of the study: the recipe's run with N = ``n``, probes after every update, every
    weight version kept (the learner's keep_weight_versions) for the evaluation afterwards.
    ``seed`` orders the prompts and seeds the learner; ``extra`` goes on top."""
    per_run = {
        "data": {"shuffle_seed": seed},
        "sampling": {"n": n},
        "train": {"steps": 100_000, "seed": seed},
        "probe": {"path": str(probes), "every": 1},
        "checkpoint_every": 0,
        "eval_every": 0,
    }
    return recipe.build_run_config(cfg, inputs, recipe.deep_merge(per_run, extra or {}))


def budget_stop(budget: int, generated0: float, first_step: int):
    """``drive``'s stop rule of an arm: stop before the next step, at this arm's mean generation
    per step so far, would pass ``budget`` paths since ``generated0``."""

    def stop(step: int, m: dict, _elapsed: float) -> bool:
        done = m.get("rollout/generated", 0) - generated0
        steps = max(1, step - first_step)
        return done + done / steps > budget

    return stop


def saturate(cfg, inputs, probes, client, stamp) -> dict:
    """Phase 2 of the module docstring; returns the plateau step P and the run's window."""
    rc = arm_config(
        cfg, inputs, probes, cfg.small_n, cfg.seeds[0], {"checkpoint_every": cfg.eval_every}
    )
    run_id = f"cd-{stamp}-saturate"
    client.start(recipe.run_config_yaml(rc), run_id=run_id)
    run_dir = Path(client.get(run_id).run_dir)
    curve: list[dict] = []
    at: dict = {}  # the plateau step's metrics, once found

    def on_step(step: int, m: dict, elapsed: float) -> bool:
        if at:
            return budget_stop(cfg.sample_budget, at["generated"], at["step"])(step, m, elapsed)
        if step % cfg.eval_every:
            return False
        version = run_dir / "weights" / f"v{int(m['learner/weight_version']):08d}"
        wait_for(version)  # the publish thread may still be writing it
        got = evaluate(cfg, inputs.model, [version], threads=1)
        curve.append({"step": step, **next(iter(got.values()))})
        values = [inputs.accuracy] + [p["accuracy"] for p in curve]
        if plateau.plateau_reached(values, cfg.plateau_window, cfg.plateau_min_gain) or (
            step >= cfg.saturate_max_steps
        ):
            at.update(step=step, generated=m.get("rollout/generated", 0))
            print(f"saturation: step {step}, accuracy {curve[-1]['accuracy']:.1%}", flush=True)
        return False

    final = drive(client, run_id, on_step)
    values = [inputs.accuracy] + [p["accuracy"] for p in curve]
    start = plateau.plateau_start(values, cfg.plateau_window, cfg.plateau_min_gain)
    return {
        "run_id": run_id,
        "run_dir": str(run_dir),
        "curve": curve,
        "plateau_reached": plateau.plateau_reached(
            values, cfg.plateau_window, cfg.plateau_min_gain
        ),
        "plateau_start_step": None if start is None else ([0] + [p["step"] for p in curve])[start],
        "step": at["step"],
        "accuracy": curve[-1]["accuracy"],
        "generated_at_plateau": at["generated"],
        "final_step": final["step"],
    }


def wait_for(path: Path, timeout_s: float = 120.0) -> None:
    """Until ``path`` exists (a weight version is renamed into place whole)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} did not appear within {timeout_s:.0f} s")
        time.sleep(0.2)


def fork(client, runs_dir: Path, source: Path, step: int, run_id: str, rc) -> Path:
    """A new run resumed from checkpoint ``step`` of the run in ``source`` with config ``rc``."""
    tag = f"step{step:07d}"
    target = runs_dir / run_id / "checkpoints"
    target.mkdir(parents=True)
    shutil.copytree(source / "checkpoints" / tag, target / tag)
    (target / "latest").write_text(tag)  # what DeepSpeed's load_checkpoint(dir) reads
    client.start(recipe.run_config_yaml(rc), run_id=run_id, resume=True)
    return runs_dir / run_id


def run_arm(client, rc, run_id, budget, generated0=0.0, first_step=0, resume_from=None) -> dict:
    if resume_from is not None:
        run_dir = fork(client, *resume_from, run_id, rc)
    else:
        client.start(recipe.run_config_yaml(rc), run_id=run_id)
        run_dir = Path(client.get(run_id).run_dir)
    final = drive(client, run_id, budget_stop(budget, generated0, first_step))
    return {"run_id": run_id, "run_dir": str(run_dir), "steps": final["step"]}


def plan(cfg) -> list[dict]:
    """Every arm after the saturation run: phase, label, N, seed, adaptive budget."""
    per_step = int(cfg.run.get("train", {}).get("groups_per_step", 1))
    out = []
    if "plateau" in cfg.phases:
        out += [
            {"phase": "plateau", "label": f"N={cfg.small_n}", "n": cfg.small_n, "seed": s}
            for s in cfg.seeds[1:]
        ]
        out += [
            {"phase": "plateau", "label": f"N={cfg.wide_n}", "n": cfg.wide_n, "seed": s}
            for s in cfg.seeds
        ]
    if "warmstart" in cfg.phases:
        for n in cfg.warm_ns:
            out += [{"phase": "warmstart", "label": f"N={n}", "n": n, "seed": s} for s in cfg.seeds]
        if cfg.adaptive_n:
            budget = {
                "kind": "adaptive",
                "total": cfg.adaptive_n * per_step,
                "n_min": cfg.adaptive_n_min,
                "n_max": cfg.adaptive_n_max,
            }
            label = f"adaptive {cfg.adaptive_n_min}..{cfg.adaptive_n_max} (mean {cfg.adaptive_n})"
            out += [
                {
                    "phase": "warmstart",
                    "label": label,
                    "n": cfg.adaptive_n,
                    "seed": s,
                    "budget": budget,
                }
                for s in cfg.seeds
            ]
    return out


def arm_extra(cfg, arm: dict) -> dict:
    """What an arm of ``plan`` sets on top of ``arm_config``: its adaptive budget, and for a
    fork of the plateau the saturation run's prompt order (its cursor is restored into it)."""
    extra: dict = {"sampling": {"budget": arm["budget"]}} if arm.get("budget") else {}
    if arm["phase"] == "plateau":
        extra["data"] = {"shuffle_seed": cfg.seeds[0]}
    return extra


def evaluate(cfg, warmstart: Path, dirs: list[Path], passk: bool = False, threads: int = 2):
    """Greedy held-out accuracy (overall and per label) of model directories or weight
    versions, with hard pass@k when ``passk``: {str(dir): row of demo.countdown.rl eval-many}.
    ``threads`` 1 while the cluster runs: two OpenMP threads on 2 busy cores spin for minutes."""
    if not dirs:
        return {}
    flags = ["--n", str(cfg.eval_problems), "--threads", str(threads)]
    if passk:
        flags += [
            "--passk-label",
            "hard",
            "--passk-problems",
            str(cfg.passk_problems),
            "--passk-samples",
            str(cfg.passk_samples),
        ]
    out = recipe.python_module(
        "demo.countdown.rl",
        "eval-many",
        "--tokenizer",
        str(warmstart),
        *flags,
        *map(str, dirs),
        capture=True,
    )
    return {row["model"]: row for row in map(json.loads, out.splitlines())}


def run_study(args) -> int:
    cfg = recipe.load_recipe(CountdownStudyConfig, args.config, args.overrides)
    recipe.require_task(cfg, "countdown", "study countdown")
    work, out = Path(args.workdir).resolve(), (REPO_ROOT / cfg.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    inputs = recipe.prepare_inputs(cfg, work)
    probes = work / "probes.jsonl"
    recipe.python_module(
        "demo.countdown.rl",
        "probes",
        "--out",
        str(probes),
        "--n",
        str(cfg.probe_problems),
        "--label",
        cfg.probe_label,
    )
    arms = plan(cfg)
    print(
        f"countdown study: warm-start accuracy {inputs.accuracy:.1%}; "
        f"{'saturation with N=%d, then ' % cfg.small_n if 'plateau' in cfg.phases else ''}"
        f"{len(arms)} more runs",
        flush=True,
    )
    spec = recipe.study_cluster_spec(cfg, inputs, work, args, "cd-study")
    stamp, runs, sat = time.strftime("%Y%m%d-%H%M%S"), [], None
    with Cluster(spec) as cluster:
        client = LearnerClient(cluster.learner_address)
        if "plateau" in cfg.phases:
            sat = saturate(cfg, inputs, probes, client, stamp)
            runs.append(
                {
                    "phase": "plateau",
                    "label": f"N={cfg.small_n}",
                    "n": cfg.small_n,
                    "seed": cfg.seeds[0],
                    "run_id": sat["run_id"],
                    "run_dir": sat["run_dir"],
                    "steps": sat["final_step"],
                    "continued": True,
                }
            )
        for i, arm in enumerate(arms):
            tag = arm["label"].split(" (")[0].replace(" ", "_").replace("=", "").replace(".", "-")
            run_id = f"cd-{stamp}-{arm['phase']}-{tag}-s{arm['seed']}"
            rc = arm_config(cfg, inputs, probes, arm["n"], arm["seed"], arm_extra(cfg, arm))
            if arm["phase"] == "plateau":
                source = (Path(sat["run_dir"]).parent, Path(sat["run_dir"]), sat["step"])
                got = run_arm(
                    client,
                    rc,
                    run_id,
                    cfg.sample_budget,
                    sat["generated_at_plateau"],
                    sat["step"],
                    resume_from=source,
                )
            else:
                got = run_arm(client, rc, run_id, cfg.sample_budget)
            runs.append({**arm, **got})
            print(
                f"[{i + 1}/{len(arms)}] {arm['phase']} {arm['label']} seed={arm['seed']}: "
                f"{got['steps']} steps ({(time.time() - started) / 60:.1f} min)",
                flush=True,
            )
        client.close()
    report = countdown_study_report.measure(cfg, inputs, sat, runs, evaluate)
    report.update(
        wall_minutes=(time.time() - started) / 60,
        command="brorl study countdown " + " ".join(args.overrides),
    )
    (out / "results.json").write_text(json.dumps(report, indent=1))
    countdown_study_report.write_tables(report, out / "tables.md")
    countdown_study_report.write_plots(report, out)
    print(f"wrote {out}/results.json, tables.md and plots in {report['wall_minutes']:.1f} min")
    return 0
