"""``brorl demo``: the whole system on this CPU, end to end.

1. warm-start the tiny demo model by supervised fine-tuning (cached after the first run),
2. write the RL prompt set and measure the warm-start's held-out greedy accuracy,
3. start reward + K rollout workers + learner as separate processes (and Redis if needed),
4. run RL with N paths per prompt through them, with a progress bar,
5. evaluate the final weights on the same held-out problems and report the gain.

The demo package (model, task, SFT, evaluation) needs torch, so it runs as subprocesses.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml
from pydantic import Field, field_validator

from brorl.config import StrictModel, deep_merge, load_config, validate
from brorl.launcher import REPO_ROOT, Cluster, ClusterSpec
from brorl.runconfig import RunConfig

DEFAULT_CONFIG = REPO_ROOT / "configs" / "demo.yaml"


class DemoConfig(StrictModel):
    workers: int = Field(2, ge=1, le=16, description="Rollout worker processes.")
    eval_problems: int = Field(500, ge=200, description="Held-out problems for the greedy accuracy.")
    train_problems: int = Field(20000, ge=100, description="Prompts written to the RL prompt set.")
    warmstart: list[str] = Field(default_factory=list, description="Extra arguments of `python -m demo warmstart`.")

    @field_validator("warmstart", mode="before")
    @classmethod
    def _flags_as_text(cls, value):
        # `warmstart=[--steps,150]` on the command line parses 150 as a number
        return [str(v) for v in value] if isinstance(value, list) else value
    threads_per_process: int = Field(1, ge=0, description="OMP threads per service process (2 cores are shared).")
    rollout: dict = Field(default_factory=dict, description="Rollout service overrides (key: value).")
    run: dict = Field(default_factory=dict, description="RunConfig for the learner; model and data.train_path are filled in.")


def add_arguments(p) -> None:
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="demo config (YAML)")
    p.add_argument("--workdir", default=str(REPO_ROOT / ".cache" / "demo"), help="cache, cluster logs and runs")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--learner-port", type=int, default=50053)
    p.add_argument("--reward-port", type=int, default=50052)
    p.add_argument("--rollout-base-port", type=int, default=50061)
    p.add_argument("overrides", nargs="*", help="demo config overrides, e.g. run.train.steps=10 workers=1")


def _python(*cmd: str, capture: bool = False) -> str:
    proc = subprocess.run([sys.executable, "-m", *cmd], cwd=REPO_ROOT, text=True,
                          stdout=subprocess.PIPE if capture else None)
    if proc.returncode:
        raise SystemExit(f"`python -m {' '.join(cmd)}` failed with exit code {proc.returncode}")
    return proc.stdout or ""


def accuracy(model: Path, n: int) -> float:
    """Held-out greedy exact-match accuracy of a demo model directory."""
    out = _python("demo", "eval", "--model", str(model), "--n", str(n), "--json", capture=True)
    return json.loads(out.strip().splitlines()[-1])["accuracy"]


def prepare_demo_inputs(work: Path, warmstart_args: list[str], train_problems: int,
                        eval_problems: int) -> tuple[Path, Path, float]:
    """Warm-start model (cached), RL prompt set and the warm-start's held-out accuracy."""
    model = work / "warmstart"
    _python("demo", "warmstart", "--out", str(model), *warmstart_args)
    data = work / "train.jsonl"
    _python("demo.rl_data", "--model", str(model), "--out", str(data), "--n", str(train_problems))
    return model, data, accuracy(model, eval_problems)


def run_demo(args) -> int:
    from brorl.cli import watch_run
    from brorl.client import LearnerClient

    cfg = load_config(DemoConfig, args.config, args.overrides, env_prefix=None)
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()

    print("== 1/4 warm-start (supervised fine-tuning; cached after the first run)")
    model, data, before = prepare_demo_inputs(work, cfg.warmstart, cfg.train_problems, cfg.eval_problems)
    print(f"   warm-start held-out greedy accuracy: {before:.1%} ({cfg.eval_problems} problems)")

    run_cfg: RunConfig = validate(RunConfig, deep_merge(cfg.run, {"model": str(model), "data": {"train_path": str(data)}}))
    config_yaml = yaml.safe_dump(json.loads(run_cfg.model_dump_json(by_alias=True)), sort_keys=False)
    print(f"== 2/4 starting the local cluster: reward, {cfg.workers} rollout workers, learner")
    spec = ClusterSpec(model=str(model), workdir=work, rollout_workers=cfg.workers, redis_url=args.redis_url,
                       reward_port=args.reward_port, learner_port=args.learner_port,
                       rollout_base_port=args.rollout_base_port, rollout_overrides=cfg.rollout,
                       threads_per_process=cfg.threads_per_process, namespace=f"demo-{os.getpid()}")
    run_id = time.strftime("demo-%Y%m%d-%H%M%S")
    with Cluster(spec) as cluster:
        print(f"   ready after {time.time() - started:.0f}s; logs in {cluster.logs}")
        print(f"== 3/4 RL: {run_cfg.train.steps} steps, N={run_cfg.sampling.n} paths per prompt")
        client = LearnerClient(cluster.learner_address)
        info = client.start(config_yaml, run_id=run_id)
        result = watch_run(client, info.run_id, info.total_steps)
        client.close()
    if result["state"] != "finished":
        print(f"run {result['state']}: {result['message']}", file=sys.stderr)
        return 1
    run_dir = Path(result["run_dir"])
    print("== 4/4 evaluating the final policy")
    after = accuracy(run_dir / "final", cfg.eval_problems)
    summary = {"run_id": run_id, "run_dir": str(run_dir), "heldout_problems": cfg.eval_problems,
               "accuracy_warmstart": before, "accuracy_final": after, "gain_points": 100 * (after - before),
               "wall_seconds": time.time() - started}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"   held-out greedy accuracy: {before:.1%} → {after:.1%} ({summary['gain_points']:+.1f} points)")
    print(f"   run directory: {run_dir} (config.yaml, metrics.jsonl, final/, summary.json)")
    print(f"   total {summary['wall_seconds'] / 60:.1f} min")
    return 0
