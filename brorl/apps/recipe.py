"""The one recipe that ``brorl demo`` and ``brorl sweep`` follow, from a config file to a running
cluster and a RunConfig:

1. load the settings (``RecipeConfig``): a config file, the files it names as ``base`` below it
   (configs/sweep.yaml takes the demo's recipe from configs/demo.yaml), then ``key=value``
   overrides from the command line;
2. prepare the inputs: the demo model's supervised warm-start (cached), the RL prompt set and the
   warm-start's held-out greedy accuracy — by ``python -m demo ...`` subprocesses, because the
   demo package needs torch and the apps import none;
3. describe the local cluster that serves them (``cluster_spec``);
4. build the RunConfig sent to the learner: the recipe's ``run`` with the prepared model and
   prompt set filled in, plus what a command sets per run (``build_run_config``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Sequence, TypeVar

import yaml
from pydantic import Field, field_validator, model_validator

from brorl.apps.cluster.launcher import REPO_ROOT, ClusterSpec
from brorl.config.base import StrictModel, deep_merge, parse_overrides, parse_text, validate
from brorl.errors import InvalidArgument
from brorl.config.run import RunConfig
from brorl import cluster
from brorl.apps import tasks

CONFIGS = REPO_ROOT / "configs"


class RecipeConfig(StrictModel):
    """Settings shared by the demo and the sweep (each command's config extends this)."""

    base: str = Field(
        "",
        description=(
            "Config file below this one (a path relative to this file), e.g. the sweep's "
            "`base: demo.yaml`; set in the file, not on the command line."
        ),
    )
    workers: int = Field(
        2, ge=1, le=16, description="Rollout worker processes of the local cluster."
    )
    threads_per_process: int = Field(
        1,
        ge=0,
        description=(
            "OMP threads per service process (0: the default; the demo machine's 2 cores are "
            "shared)."
        ),
    )
    rollout_cpu_bind: str = Field(
        "auto",
        pattern=r"^(auto|spread|nobind|[0-9][0-9,\-]*)$",
        description=(
            "Cores of each rollout worker: 'spread' pins worker i to the i-th core, 'auto' "
            "every core but the last (vLLM's choice: core 0 of a 2-core machine), or a core "
            "list for every worker; the reward service shares the workers' cores and the "
            "learner gets the others (brorl/apps/cluster/placement.py). 'nobind' pins nothing."
        ),
    )
    background_nice: int = Field(
        0,
        ge=0,
        le=19,
        description=(
            "Nice value (19: the lowest priority) of the cluster's background work, the reward "
            "and environment services and the workers' tail processes on the learner's cores, "
            "each in a scheduling autogroup of its own below the learner and the engines "
            "(brorl/priority.py). For a learner-bound run whose reward service shares the "
            "learner's core; where the rollout is the bound it delays the rollout "
            "(docs/performance.md). 0: the same priority as the others."
        ),
    )
    train_problems: int = Field(
        20000,
        ge=100,
        description="Prompts written to the RL prompt set (disjoint from the held-out problems).",
    )
    train_labels: list[Literal["easy", "medium", "hard"]] = Field(
        default_factory=list,
        description="Countdown only: RL prompts of these difficulty labels only (none: every "
        "label); the held-out evaluation keeps every label.",
    )
    eval_problems: int = Field(
        200, ge=50, description="Held-out problems of each greedy-accuracy evaluation."
    )
    warmstart: list[str] = Field(
        default_factory=list,
        description=(
            "Extra arguments of `python -m demo warmstart` (none: the demo's warm-start recipe)."
        ),
    )
    rollout: dict = Field(
        default_factory=dict, description="Rollout service overrides (key: value) for every worker."
    )
    reward: dict = Field(
        default_factory=dict,
        description="Reward service overrides (key: value), e.g. a reward function with its "
        "parameters: {functions: {countdown_fmt: {type: countdown, format_weight: 0.1}}}.",
    )
    learner: dict = Field(
        default_factory=dict,
        description="Learner service overrides (key: value), e.g. {torch_threads: 2}: the "
        "learner's own thread count over threads_per_process.",
    )
    learner_ranks: int = Field(
        1,
        ge=1,
        le=16,
        description="Learner ranks (data-parallel DeepSpeed processes; docs/scaling.md).",
    )
    run: dict = Field(
        default_factory=dict,
        description=(
            "RunConfig for the learner; model and data.train_path are filled in from the prepared "
            "inputs."
        ),
    )
    task: Literal[tasks.TASKS] = Field(
        "addition",
        description="What the recipe trains on (brorl/apps/tasks.py): 'addition' (the demo's "
        "arithmetic) or 'tooluse' (multiplication with a calculator tool: multi-turn episodes "
        "against an environment service the cluster starts).",
    )
    environment: dict = Field(
        default_factory=dict,
        description="Overrides of the environment service the task starts (`python -m envs` "
        "key: value, e.g. {calculator.tool: false} for the task without its tool).",
    )

    @field_validator("warmstart", mode="before")
    @classmethod
    def _flags_as_text(cls, value):
        # `warmstart=[--steps,150]` on the command line parses 150 as a number
        return [str(v) for v in value] if isinstance(value, list) else value

    @model_validator(mode="after")
    def _labels_of_countdown(self):
        if self.train_labels and self.task != "countdown":
            raise ValueError(f"train_labels: task {self.task!r} has no difficulty labels")
        return self


R = TypeVar("R", bound=RecipeConfig)


@dataclass(frozen=True)
class DemoInputs:
    """What every run of the demo and the sweep starts from."""

    model: Path  # the warm-started policy: a Hugging Face model directory
    data: Path  # the RL prompt set: JSONL of {"prompt", "reference"}
    accuracy: float  # the warm-start's held-out greedy accuracy
    heldout: Path | None = None  # held-out prompts for the run's eval_every rounds
    by_stratum: dict[str, float] = field(default_factory=dict)  # the accuracy per label
    verdicts: dict[str, dict[str, float]] = field(default_factory=dict)  # label: verdict: share


def add_arguments(
    p, config: Path, workdir: Path, overrides_help: str, base_port: int | None = None
) -> None:
    """The arguments every recipe command takes, and ``--base-port`` (``base_port_layout``) for
    the commands that give it (the demo names its ports one by one)."""
    p.add_argument("--config", default=str(config), help="settings (YAML)")
    p.add_argument("--workdir", default=str(workdir), help="cache, cluster logs and runs")
    p.add_argument("--redis-url", default=cluster.REDIS_URL)
    if base_port is not None:
        p.add_argument(
            "--base-port",
            type=int,
            default=base_port,
            help="reward: this port, learner: +1, rollout worker i: +10+i",
        )
    p.add_argument("overrides", nargs="*", help=overrides_help)


def base_port_layout(base: int) -> dict[str, int]:
    """The cluster's ports from a command's ``--base-port`` (sweep, study, and their checks):
    brorl.cluster's one rule (reward this port, learner +1, rollout worker i +10+i)."""
    return cluster.ClusterLayout.from_base_port(base).ports()


def load_recipe(cls: type[R], path: str | Path, overrides: Sequence[str] = ()) -> R:
    """``path`` over its base files, then ``key=value`` overrides (no environment layer: these
    are commands, not services), validated as ``cls``."""
    top = parse_overrides(overrides)
    if "base" in top:
        raise InvalidArgument(
            "base", "name the base file in the config file, not on the command line"
        )
    return validate(cls, deep_merge(_read_with_bases(Path(path)), top))


def _read_with_bases(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    path = path.resolve()
    if path in seen:
        raise InvalidArgument(
            "base",
            "config files name each other as base: " + " -> ".join(str(p) for p in (*seen, path)),
        )
    if not path.is_file():
        raise InvalidArgument("config" if not seen else "base", f"file {path} does not exist")
    data = parse_text(path.read_text(), source=str(path))
    base = data.get("base")
    if not base:
        return data
    if not isinstance(base, str):
        raise InvalidArgument("base", f"{path}: must be a file name, got {base!r}")
    return deep_merge(_read_with_bases(path.parent / base, (*seen, path)), data)


def python_module(*cmd: str, capture: bool = False) -> str:
    """Run ``python -m cmd...`` in the repository; its stdout when ``capture``. Exits on failure."""
    proc = subprocess.run(
        [sys.executable, "-m", *cmd],
        cwd=REPO_ROOT,
        text=True,
        stdout=subprocess.PIPE if capture else None,
    )
    if proc.returncode:
        raise SystemExit(f"`python -m {' '.join(cmd)}` failed with exit code {proc.returncode}")
    return proc.stdout or ""


def accuracy(model: Path, n: int, cfg: RecipeConfig | None = None) -> float:
    """Held-out greedy accuracy of a demo model directory on ``n`` problems of the recipe's
    task (exact match for addition, solved episodes for tooluse; brorl/apps/tasks.py)."""
    return tasks.accuracy(cfg or RecipeConfig(), model, n, python_module)


def evaluate(model: Path, n: int, cfg: RecipeConfig) -> dict:
    """``accuracy`` with the task's per-stratum accuracy and the verdicts of its greedy answers
    beside it ({} for a task without them): {"accuracy", "by_stratum", "verdicts"}."""
    return tasks.evaluate(cfg, model, n, python_module)


def eval_dirs(tokenizer: Path, dirs: list[Path], n: int) -> dict[str, float]:
    """Held-out greedy accuracy of model directories (e.g. published weight versions, which
    hold no tokenizer) in one ``python -m demo.eval_many`` process: {str(dir): accuracy}."""
    if not dirs:
        return {}
    out = python_module(
        "demo.eval_many",
        "--tokenizer",
        str(tokenizer),
        "--n",
        str(n),
        *map(str, dirs),
        capture=True,
    )
    return {row["model"]: row["accuracy"] for row in map(json.loads, out.splitlines())}


def eval_versions(weights: Path, tokenizer: Path, versions: list[int], n: int) -> dict[int, float]:
    """Held-out greedy accuracy of the published weight versions of a run's weight store."""
    dirs = {v: weights / f"v{v:08d}" for v in versions}
    acc = eval_dirs(tokenizer, list(dirs.values()), n)
    return {v: acc[str(d)] for v, d in dirs.items()}


def prepare_inputs(cfg: RecipeConfig, work: Path) -> DemoInputs:
    """Warm-start model (cached under ``work``), RL prompt set and the warm-start's accuracy,
    for the recipe's task."""
    model, data, heldout, got = tasks.prepare(cfg, work, python_module)
    return DemoInputs(model, data, got["accuracy"], heldout, got["by_stratum"], got["verdicts"])


def cluster_spec(
    cfg: RecipeConfig,
    inputs: DemoInputs,
    work: Path,
    *,
    redis_url: str,
    reward_port: int,
    learner_port: int,
    rollout_base_port: int,
    namespace: str,
    learner_overrides: dict | None = None,
    env_port: int = 0,
) -> ClusterSpec:
    """The local cluster (reward, ``cfg.workers`` rollout workers, learner) serving
    ``inputs.model``."""
    return ClusterSpec(
        model=str(inputs.model),
        workdir=work,
        rollout_workers=cfg.workers,
        redis_url=redis_url,
        reward_port=reward_port,
        learner_port=learner_port,
        rollout_base_port=rollout_base_port,
        rollout_overrides=cfg.rollout,
        reward_overrides=cfg.reward,
        learner_overrides={
            "ranks": cfg.learner_ranks,
            **cfg.learner,
            **(learner_overrides or {}),
        },
        threads_per_process=cfg.threads_per_process,
        namespace=namespace,
        rollout_cpu_bind=cfg.rollout_cpu_bind,
        background_nice=cfg.background_nice,
        environment=tasks.environment(cfg),
        **({"env_port": env_port} if env_port else {}),
    )


def study_cluster_spec(cfg: RecipeConfig, inputs: DemoInputs, work: Path, args, name: str):
    """The cluster of a recipe command (sweep, study, compare): ports from ``--base-port``, every
    weight version kept (they are evaluated after the runs), a namespace of its own."""
    return cluster_spec(
        cfg,
        inputs,
        work,
        redis_url=args.redis_url,
        **base_port_layout(args.base_port),
        learner_overrides={"keep_weight_versions": 100_000},
        namespace=f"{name}-{os.getpid()}",
    )


def require_task(cfg: RecipeConfig, task: str, command: str) -> None:
    """The sweep, the studies and the comparison evaluate weight versions with one task's
    evaluator (demo.eval_many for addition, demo.countdown.rl for countdown); another task is
    refused before anything starts."""
    if cfg.task != task:
        raise InvalidArgument("task", f"`brorl {command}` runs the {task} task only")


def env_address(spec: ClusterSpec) -> str:
    """Where the cluster of ``spec`` serves its environment (when its task has one)."""
    return f"{spec.host}:{spec.env_port}"


def build_run_config(
    cfg: RecipeConfig, inputs: DemoInputs, per_run: dict | None = None, env_address: str = ""
) -> RunConfig:
    """The recipe's ``run`` with the prepared model and prompt set (and held-out set), then
    ``per_run`` on top; a task with an environment points the run at ``env_address``."""
    filled = {"model": str(inputs.model), "data": {"train_path": str(inputs.data)}}
    if inputs.heldout is not None:
        filled["data"]["eval_path"] = str(inputs.heldout)
    if tasks.environment(cfg):
        filled["env"] = {"address": env_address}
    return validate(RunConfig, deep_merge(deep_merge(cfg.run, filled), per_run or {}))


def run_config_yaml(run_cfg: RunConfig) -> str:
    """The text LearnerService.StartRun takes (``async`` under its YAML name)."""
    return yaml.safe_dump(json.loads(run_cfg.model_dump_json(by_alias=True)), sort_keys=False)


def mean_std(values: list[float], digits: int = 3) -> str:
    """A table cell of the commands' reports: "mean ± std" over seeds (the mean alone for one
    value, "-" for none)."""
    if not values:
        return "-"
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {statistics.pstdev(values):.{digits}f}"
