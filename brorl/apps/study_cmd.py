"""``brorl study broaden``: does broadening N revive a policy that saturated under a small N?
(issue 14; docs/broadening.md). Everything runs through the real services on one local cluster.

1. Inputs (brorl/apps/recipe.py): a warm-start on a task the demo model only partly solves
   (configs/broaden.yaml: 3-digit addition taught by a demonstrator that forgets carries), the
   RL prompt set, and a probe set of held-out problems with known answers (demo/probe_data.py).
2. Saturation: RL with N = ``small_n``; every ``eval_every`` steps the published weights are
   evaluated (held-out greedy accuracy) and the run stops when the curve has plateaued
   (``brorl.apps.plateau``: no gain above ``plateau_min_gain`` over ``plateau_window`` evaluations)
   or at ``saturate_max_steps``. The weights of the last evaluated step are the plateau policy.
3. Continuation from the plateau policy (fresh optimizer state), for every seed:
   ``equal_samples``: N = small_n and N = wide_n, each until ``sample_budget`` paths were
   generated; ``equal_wall``: both for ``wall_s`` seconds; ``budget``: N = budget_n uniform vs
   the adaptive per-prompt budget of the same total (sampling.budget), until ``sample_budget``.
   Every run logs probe mass (probe/*) after every update.
4. Evaluation after all runs: held-out accuracy at ``eval_points`` evenly spaced steps of each
   run, pass@k (k = 1, 2, 4, ... up to ``passk_samples``) of its final weights and of the
   plateau policy; EUR, reward entropy, mixed-group fraction and probe metrics from metrics.jsonl.
   Writes ``results.json``, ``tables.md`` and PNG plots under ``out`` (brorl/apps/study_report.py).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Callable, Literal

from pydantic import Field

from brorl.apps import plateau, recipe, study_report
from brorl.apps.cluster.launcher import REPO_ROOT, Cluster
from brorl.client import LearnerClient

REGIMES = ("equal_samples", "equal_wall", "budget")


class SaturationStudyConfig(recipe.RecipeConfig):
    """What the studies of a saturated policy share (``brorl study broaden`` and ``countdown``):
    the narrow and wide N, seeds, the plateau rule, the sample budget and the measurements."""

    small_n: int = Field(16, ge=2, description="N of the saturation phase and the narrow arm.")
    wide_n: int = Field(512, ge=2, description="N of the broadened arm.")
    seeds: list[int] = Field([0, 1, 2], min_length=1, description="Seeds of the arms.")
    eval_every: int = Field(5, ge=1, description="Steps between evaluations while saturating.")
    plateau_window: int = Field(3, ge=1, description="Evaluations without gain that a plateau is.")
    plateau_min_gain: float = Field(
        0.01, ge=0.0, description="Accuracy gain over the window that still counts as a plateau."
    )
    saturate_max_steps: int = Field(
        300, ge=1, description="Stop saturating here even without a plateau (reported)."
    )
    sample_budget: int = Field(
        20480, ge=1, description="Paths generated per run of a sample-budget arm."
    )
    eval_points: int = Field(4, ge=1, description="Evaluations per arm.")
    probe_problems: int = Field(32, ge=1, description="Prompts of the probe set.")
    passk_problems: int = Field(100, ge=1, description="Held-out problems of pass@k.")
    passk_samples: int = Field(64, ge=1, description="Samples per problem; pass@k up to this k.")
    out: str = Field("docs/broadening", description="Where results, tables and plots go.")


class BroadenConfig(SaturationStudyConfig):
    """configs/broaden.yaml (over configs/demo.yaml): the study's task, phases and arms."""

    saturate_seed: int = Field(0, description="Seed of the saturation run.")
    wall_s: float = Field(120.0, gt=0, description="Seconds per run in the equal_wall arms.")
    max_steps: int = Field(
        10_000, ge=1, description="Step cap of a continuation run (it normally stops earlier)."
    )
    budget_n: int = Field(64, ge=2, description="Mean paths per group in the budget arms.")
    budget_n_min: int = Field(4, ge=1, description="n_min of the adaptive budget.")
    budget_n_max: int = Field(512, ge=1, description="n_max of the adaptive budget.")
    regimes: list[Literal["equal_samples", "equal_wall", "budget"]] = Field(
        list(REGIMES), description="Which continuation comparisons to run."
    )


def add_arguments(p) -> None:
    """``p``: the parser of ``brorl study broaden``."""
    recipe.add_arguments(
        p,
        recipe.CONFIGS / "broaden.yaml",
        REPO_ROOT / ".cache" / "broaden",
        "study config overrides, e.g. seeds=[0] sample_budget=4096",
        50260,
    )



def arms(cfg: BroadenConfig) -> list[dict]:
    """Every continuation run, in the order they run: regime, label, what it sets, seed."""
    per_step = int(cfg.run.get("train", {}).get("groups_per_step", 1))
    kinds = {
        "equal_samples": [
            (f"N={cfg.small_n}", cfg.small_n, None),
            (f"N={cfg.wide_n}", cfg.wide_n, None),
        ],
        "equal_wall": [
            (f"N={cfg.small_n}", cfg.small_n, None),
            (f"N={cfg.wide_n}", cfg.wide_n, None),
        ],
        "budget": [
            (f"uniform N={cfg.budget_n}", cfg.budget_n, None),
            (
                f"adaptive {cfg.budget_n_min}..{cfg.budget_n_max}",
                cfg.budget_n,
                {
                    "kind": "adaptive",
                    "total": cfg.budget_n * per_step,
                    "n_min": cfg.budget_n_min,
                    "n_max": cfg.budget_n_max,
                },
            ),
        ],
    }
    return [
        {"regime": regime, "label": label, "n": n, "budget": budget, "seed": seed}
        for regime in cfg.regimes
        for label, n, budget in kinds[regime]
        for seed in cfg.seeds
    ]


def run_config(
    cfg: BroadenConfig,
    inputs: recipe.DemoInputs,
    probes: Path,
    n: int,
    seed: int,
    steps: int,
    budget: dict | None = None,
):
    sampling: dict = {"n": n}
    if budget:
        sampling["budget"] = budget
    return recipe.build_run_config(
        cfg,
        inputs,
        {
            "data": {"shuffle_seed": seed},
            "sampling": sampling,
            "train": {"steps": steps, "seed": seed},
            "async": {"publish_every": 1},
            "probe": {"path": str(probes), "every": 1},
            "checkpoint_every": 0,
        },
    )


def drive(client: LearnerClient, run_id: str, on_step: Callable[[int, dict, float], bool]) -> dict:
    """Follow a run; ``on_step(step, metrics, seconds since the learner started it)`` returning
    True stops it. The clock starts at the run's start event (policy built, version 0
    published), so model loading is not counted. Returns the final RunInfo as a dict."""
    started, stopping = time.monotonic(), False
    for m in client.watch(run_id):
        if m.event in ("done", "failed", "stopped"):
            break
        if m.event == "start":
            started = time.monotonic()
        if "learner/loss" in m.values and not stopping:
            if on_step(m.step, dict(m.values), time.monotonic() - started):
                client.stop(run_id)
                stopping = True
    info = client.get(run_id)
    if info.state not in ("finished", "stopped"):
        raise SystemExit(f"run {run_id} {info.state}: {info.message}")
    return {"state": info.state, "step": info.step, "run_dir": info.run_dir}


def read_metrics(run_dir: Path) -> tuple[list[dict], float]:
    """A run's update metrics and the time of its start event (the wall clock's zero)."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    t0 = next((m["time"] for m in lines if m.get("event") == "start"), lines[0]["time"])
    return [m for m in lines if "learner/loss" in m], t0


def plateau_model(version_dir: Path, warmstart: Path, out: Path) -> Path:
    """A model directory of a published weight version (a keyframe + delta chain) with the
    warm-start's config, tokenizer and task marker."""
    from brorl.weights.chain import export_hf

    return export_hf(version_dir, warmstart, out)


def saturate(cfg, inputs, probes, client, stamp) -> dict:
    """Phase 2 of the module docstring: RL with small_n until the held-out curve plateaus."""
    rc = run_config(cfg, inputs, probes, cfg.small_n, cfg.saturate_seed, cfg.saturate_max_steps)
    run_id = f"broaden-{stamp}-saturate"
    client.start(recipe.run_config_yaml(rc), run_id=run_id)
    run_dir = Path(client.get(run_id).run_dir)
    curve: list[dict] = []

    def on_step(step: int, metrics: dict, _elapsed: float) -> bool:
        if step % cfg.eval_every and step < cfg.saturate_max_steps:
            return False
        acc = recipe.eval_versions(run_dir / "weights", inputs.model, [step], cfg.eval_problems)
        curve.append({"step": step, "accuracy": acc[step]})
        values = [inputs.accuracy] + [p["accuracy"] for p in curve]
        return plateau.plateau_reached(values, cfg.plateau_window, cfg.plateau_min_gain)

    drive(client, run_id, on_step)
    values = [inputs.accuracy] + [p["accuracy"] for p in curve]
    reached = plateau.plateau_reached(values, cfg.plateau_window, cfg.plateau_min_gain)
    start = plateau.plateau_start(values, cfg.plateau_window, cfg.plateau_min_gain)
    return {
        "run_id": run_id,
        "curve": curve,
        "plateau_reached": reached,
        # index 0 of `values` is the warm-start (step 0)
        "plateau_start_step": None if start is None else ([0] + [p["step"] for p in curve])[start],
        "step": curve[-1]["step"],
        "accuracy": curve[-1]["accuracy"],
        "run_dir": str(run_dir),
    }


def continue_arm(cfg, inputs, probes, client, stamp, arm) -> dict:
    """One continuation run from the plateau policy, stopped by its regime's rule."""
    rc = run_config(cfg, inputs, probes, arm["n"], arm["seed"], cfg.max_steps, arm["budget"])
    tag = arm["label"].replace(" ", "_").replace("=", "").replace(".", "-")
    run_id = f"broaden-{stamp}-{arm['regime']}-{tag}-s{arm['seed']}"
    client.start(recipe.run_config_yaml(rc), run_id=run_id)
    if arm["regime"] == "equal_wall":

        def stop(step, m, elapsed):
            return elapsed >= cfg.wall_s
    else:  # equal generated samples: stop when the next step, at this run's mean generation
        # per step so far (all-equal groups included), would pass the budget

        def stop(step, m, elapsed):
            return m.get("rollout/generated", 0) * (step + 1) / step > cfg.sample_budget

    final = drive(client, run_id, stop)
    return {**arm, "run_id": run_id, "run_dir": final["run_dir"], "steps": final["step"]}


def eval_points(steps: int, k: int) -> list[int]:
    """``k`` evenly spaced steps in 1..steps (fewer only when steps < k)."""
    return sorted({max(1, round(steps * (i + 1) / k)) for i in range(k)})


def summarize(row: dict, run: tuple[list[dict], float], acc: dict[int, float], passk: dict):
    """One continuation run's row of results.json (``run``: ``read_metrics``)."""
    metrics, t0 = run
    by_step = {m["step"]: m for m in metrics}

    def mean(key):
        vals = [m[key] for m in metrics if key in m]
        return statistics.fmean(vals) if vals else None

    probed = [m for m in metrics if "probe/mean_change" in m]
    curve = [
        {
            "step": s,
            "samples": by_step[s].get("rollout/generated", 0),
            "wall_s": by_step[s]["time"] - t0,
            "accuracy": acc[s],
        }
        for s in eval_points(row["steps"], len(acc))
    ]
    return {
        **{k: v for k, v in row.items() if k != "run_dir"},
        "generated": metrics[-1].get("rollout/generated", 0),
        "wall_s": metrics[-1]["time"] - t0,
        "curve": curve,
        "accuracy_final": curve[-1]["accuracy"],
        "pass_at_k": passk,
        "eur_mean": mean("explore/eur"),
        "reward_entropy_mean": mean("explore/reward_entropy"),
        "mixed_groups_mean": mean("explore/mixed_groups"),
        "probe_fell_fraction_mean": mean("probe/fell_fraction"),
        "probe_mean_change_mean": mean("probe/mean_change"),
        # updates that lowered the probes' mean correct-answer log-prob, of all measured
        "probe_updates_lowering": (
            statistics.fmean(m["probe/mean_change"] < 0 for m in probed) if probed else None
        ),
    }


def pass_at_k(cfg, tokenizer: Path, models: list[Path]) -> dict[str, dict]:
    ks = [k for k in (2**i for i in range(13)) if k <= cfg.passk_samples]
    out = recipe.python_module(
        "demo.passk",
        "--tokenizer",
        str(tokenizer),
        "--n",
        str(cfg.passk_problems),
        "--samples",
        str(cfg.passk_samples),
        "--ks",
        ",".join(map(str, ks)),
        *map(str, models),
        capture=True,
    )
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {row["model"]: row["pass_at_k"] for row in rows}


def run_study(args) -> int:
    cfg = recipe.load_recipe(BroadenConfig, args.config, args.overrides)
    recipe.require_task(cfg, "addition", "study broaden")
    work = Path(args.workdir).resolve()
    out = (REPO_ROOT / cfg.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    inputs = recipe.prepare_inputs(cfg, work)
    probes = work / "probes.jsonl"
    recipe.python_module(
        "demo.probe_data",
        "--model",
        str(inputs.model),
        "--out",
        str(probes),
        "--n",
        str(cfg.probe_problems),
        "--skip",
        str(cfg.eval_problems),
    )
    plan = arms(cfg)
    print(
        f"broaden: warm-start accuracy {inputs.accuracy:.1%}; saturating with N={cfg.small_n}, "
        f"then {len(plan)} continuation runs",
        flush=True,
    )
    spec = recipe.study_cluster_spec(cfg, inputs, work, args, "broaden")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with Cluster(spec) as cluster:
        client = LearnerClient(cluster.learner_address)
        sat = saturate(cfg, inputs, probes, client, stamp)
        print(
            f"saturation: {len(sat['curve'])} evaluations, plateau "
            f"{'reached' if sat['plateau_reached'] else 'NOT reached'} at step {sat['step']} "
            f"(accuracy {sat['accuracy']:.1%})",
            flush=True,
        )
        weights = Path(sat["run_dir"]) / "weights" / f"v{sat['step']:08d}"
        model = plateau_model(weights, inputs.model, work / "plateau")
        base = recipe.DemoInputs(model, inputs.data, sat["accuracy"])
        done = []
        for i, arm in enumerate(plan):
            done.append(continue_arm(cfg, base, probes, client, stamp, arm))
            print(
                f"[{i + 1}/{len(plan)}] {arm['regime']} {arm['label']} seed={arm['seed']}: "
                f"{done[-1]['steps']} steps ({(time.time() - started) / 60:.1f} min)",
                flush=True,
            )
        client.close()
    versions = {}
    for row in done:
        for s in eval_points(row["steps"], cfg.eval_points):
            versions[Path(row["run_dir"]) / "weights" / f"v{s:08d}"] = (row["run_id"], s)
    accs = recipe.eval_dirs(model, list(versions), cfg.eval_problems)
    finals = [Path(r["run_dir"]) / "weights" / f"v{r['steps']:08d}" for r in done]
    passk = pass_at_k(cfg, model, [model, *finals])
    runs = []
    for row, final in zip(done, finals):
        acc = {s: accs[str(d)] for d, (rid, s) in versions.items() if rid == row["run_id"]}
        runs.append(summarize(row, read_metrics(Path(row["run_dir"])), acc, passk[str(final)]))
    report = {
        "config": cfg.model_dump(),
        "warmstart_accuracy": inputs.accuracy,
        "saturation": {**sat, "pass_at_k": passk[str(model)]},
        "runs": runs,
        "wall_minutes": (time.time() - started) / 60,
        "command": "brorl study broaden " + " ".join(args.overrides),
    }
    (out / "results.json").write_text(json.dumps(report, indent=1))
    study_report.write_tables(report, out / "tables.md")
    study_report.write_plots(report, out)
    print(f"wrote {out}/results.json, tables.md and plots in {report['wall_minutes']:.1f} min")
    return 0
