"""The whole pipeline on the demo task, timed: one RL run through the real services, then the
same rollout workers alone. Prints ONE JSON object (progress goes to stderr).

    python bench/e2e.py [--config configs/demo_fast.yaml] [--eval-every 5] [--target 0.63] [k=v ...]
    python bench/e2e.py --shape long [k=v ...]

``--shape long`` runs the realistic shape of demo/long_shape.py instead of the demo's (a 24 M
model, 146-token prompts, completions up to 48 tokens, the relevance reward): throughput only, no
accuracy curve.

``key=value`` overrides go to the demo recipe (configs/demo.yaml by default), e.g.
``run.sampling.n=64 run.train.groups_per_step=16 run.train.steps=30``.

Reported:
* ``cluster_start_s``: from launching the services to every one SERVING (mostly vLLM engines);
* ``rl_s`` and ``paths_per_s``: from StartRun to the last step, and generated paths per second;
  ``trained_paths_per_s``: the paths the learner trained on per second (fewer: groups dropped as
  all-equal or as stale were generated but not trained); ``stale_paths``: those dropped as stale
  (sampled by weights more than ``async.max_staleness`` versions older than the update that took
  them);
* ``rollout_alone_paths_per_s``: the same workers generating and scoring the same kind of groups
  with no learner (one client thread per worker calling Generate then ScoreBatch), and
  ``pipeline_ratio`` = paths_per_s / rollout_alone_paths_per_s;
* ``worker_alone_paths_per_s``: the workers' own loop with no learner
  (bench/baselines/worker_loop.py: the run's jobs, several prompts a call, selection, groups
  published through Redis and taken as they arrive, no weight reloads), and
  ``worker_pipeline_ratio`` = paths_per_s / it: what the pipeline keeps of the rollout as the
  run's workers do it, where ``pipeline_ratio`` also charges the pipeline with the loop's own
  work per group;
* ``learner_alone_paths_per_s``: the run's generated paths per step ÷ the standalone update's
  seconds (below), the pace of a learner that never waits; ``bottleneck_ratio`` = paths_per_s /
  the slower of the two alone (the pipeline ratio when the rollout bounds the run; where the
  learner does, as in the long shape, the share of the learner's own pace the pipeline keeps);
* ``work_bound_paths_per_s``: what the cores could train if the two stages shared them with no
  loss, the machine's cores ÷ the core-seconds a path costs the rollout alone (on its engines'
  cores) and the learner alone (on its thread's); ``work_bound_ratio`` (``steady_…``) =
  paths_per_s / it: the yardstick where the learner is the slower stage and no pipeline can
  reach the rollout's pace (bench/pipeline/bound.py; a bound, counted high where scoring is a
  large share of a path);
* ``steady_paths_per_s``, ``steady_pipeline_ratio``, ``steady_bottleneck_ratio``: the same from
  the end of the first step to the last (``steady_rate``): without the pipeline's fill, the
  first step's wait for the run's first groups (vLLM's first calls, the first reload), which
  a short run pays once and a long one amortizes;
* ``step_phases_s``: mean seconds per step of each learner phase (wait for data, batch,
  forward, backward, optimizer, publish; ``borrowed``: the part of the update run on the
  workers' cores as well, services/learner/cores.py; ``update_running`` and ``update_runnable``:
  the update's training thread on its core, and waiting for it) and, per group, the rollout's
  generate seconds (and within them vLLM's queue, prefill and decode seconds), score seconds,
  the Redis publish of the group, and its reload and idle seconds before the job (and of those,
  the wait for the weight version the job asks for: ``rollout_version_wait_per_group``);
* ``learner_flops_over_peak``: 6 × parameters × positions × epochs (train.passes) / (forward +
  backward + optimizer seconds), over a peak GEMM FLOP/s measured here with the learner's
  thread count;
  ``learner_standalone_flops_over_peak``: the same update shape (the run's model, N, groups per
  step, micro-batch, epochs, minibatches, autocast and threads; synthetic completions as long as the
  run's on average and padded to the run's length, ``completion_range``; the same forward +
  backward + optimizer phases; default lr and no KL) timed alone after the cluster stopped
  (bench/learner_update.py; as many updates as fit 10 s at the pipeline's mean, 3 to the run's
  count: ``LearnerCompute.standalone_updates``), and ``learner_in_pipeline_ratio`` =
  in-pipeline ÷ alone; both sides sum the updates after a process's first (the standalone's
  first is an untimed warm-up, the pipeline's pays the first backward and optimizer step:
  bench/pipeline/steps.py); the peak
  is fp32's, also under ``learner_autocast`` bf16 (the run's train.autocast;
  ``learner_forward_dtype``: what it came to on this machine's CPU, bf16 or fp32);
* ``learner_update_runnable_share``: of the pipeline's update seconds, those its training thread
  was ready to run but waiting for its core, taken by another process or thread
  (``learner/update_runnable_s``, services/learner/observe/thread_clock.py): the part of the
  learner's loss inside the pipeline that is the core's sharing, not a slower update;
* ``learner_logp_gap``: the mean over steps of learner/logp_gap, how far the learner's
  log-probs of the sampled tokens are from the sampler's (bf16 autocast widens it);
* ``rollout_reload_share``: a worker's seconds applying published weights ÷ its seconds
  generating plus applying (per group, means over the run);
* ``accuracy_curve`` and ``seconds_to_target``: held-out greedy accuracy of the published
  version every ``--eval-every`` steps (evaluated after the run, so evaluation takes no CPU
  from it) and the RL seconds at the first step whose accuracy reaches ``--target``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import stdout_to_stderr  # noqa: E402
from demo import long_shape  # noqa: E402
from bench.learner_update import run_update  # noqa: E402
from bench.peak import peak_gemm_flops  # noqa: E402
from bench.pipeline.bound import stage_cores, work_bound  # noqa: E402
from bench.pipeline.steps import learner_compute, step_phases, steady_rate  # noqa: E402
from bench.baselines.worker_loop import worker_loop_alone  # noqa: E402
from brorl.cluster import REDIS_URL  # noqa: E402
from brorl.apps import recipe  # noqa: E402
from brorl.apps.demo_cmd import DemoConfig  # noqa: E402
from brorl.apps.cluster.launcher import Cluster  # noqa: E402
from brorl.apps.progress import watch_run  # noqa: E402
from brorl.apps.recipe import DemoInputs, eval_versions  # noqa: E402
from brorl.client import LearnerClient, RewardClient, RolloutClient  # noqa: E402
from services.rollout import batching  # noqa: E402
from services.rollout.config import RolloutServiceConfig  # noqa: E402

# the printed object's documented keys (tests/unit/bench/test_bench_smoke.py checks them)
KEYS = ("bench", "cluster_start_s", "rl_s", "paths_per_s", "trained_paths_per_s",
        "rollout_alone_paths_per_s", "pipeline_ratio", "step_phases_s", "learner_flops_over_peak",
        "learner_standalone_flops_over_peak", "learner_in_pipeline_ratio", "rollout_reload_share",
        "learner_alone_paths_per_s", "bottleneck_ratio", "steady_paths_per_s",
        "steady_pipeline_ratio", "steady_bottleneck_ratio", "worker_alone_paths_per_s",
        "worker_pipeline_ratio", "steady_worker_pipeline_ratio", "accuracy_curve",
        "seconds_to_target", "learner_update_runnable_share", "work_bound_paths_per_s",
        "work_bound_ratio", "steady_work_bound_ratio")  # fmt: skip


def forward_dtype(autocast: str) -> str:
    """The learner's forward dtype here for a train.autocast setting ('native': bf16 only where
    this CPU multiplies bf16 natively)."""
    import torch

    from services.learner.model.autocast import autocast_enabled

    return "bf16" if autocast_enabled(autocast, torch.device("cpu")) else "fp32"


def log(msg: str) -> None:
    print(f"[e2e] {msg}", file=sys.stderr, flush=True)


def rollout_alone(cluster: Cluster, cfg, run_cfg, prompts: list[dict], seconds: float):
    """Paths/s of the workers generating + scoring groups like the run's, with no learner. The
    worker loop samples several narrow groups in one engine call (services/rollout/batching.py);
    Generate takes one prompt, so each call here asks for as many paths of one prompt as the
    loop's calls hold (prefill aside, the same engine work)."""
    s, workers = run_cfg.sampling, cfg.workers
    default = RolloutServiceConfig.model_fields["batch_paths"].default
    batch_paths = cfg.rollout.get("batch_paths", default)
    per_call = s.n * batching.claim_count(batch_paths, s.n)
    counts = [0] * workers
    deadline = time.monotonic() + seconds

    def drive(i: int) -> None:
        rollout = RolloutClient(cluster.rollout_address(i))
        reward = RewardClient(cluster.reward_address, deadline_s=300)
        k = i
        while time.monotonic() < deadline:
            row = prompts[k % len(prompts)]
            k += workers
            resp = rollout.generate(
                row["prompt"],
                n=per_call,
                temperature=s.temperature_at(0),
                top_k=s.top_k,
                top_p=s.top_p,
                max_tokens=s.max_tokens,
            )
            items = [
                {
                    "id": p.path_id,
                    "prompt": row["prompt"],
                    "completion": p.text,
                    "reference": row["reference"],
                }
                for p in resp.paths
            ]
            reward.score_batch(run_cfg.reward_fn, items)
            counts[i] += len(resp.paths)

    start = time.monotonic()
    threads = [threading.Thread(target=drive, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--eval-every", type=int, default=5, help="steps between evaluated versions")
    p.add_argument("--target", type=float, default=0.63, help="held-out accuracy target")
    p.add_argument("--rollout-seconds", type=float, default=30.0, help="rollout-alone window")
    p.add_argument("--worker-seconds", type=float, default=15.0, help="worker-loop-alone window")
    p.add_argument("--config", default=str(REPO / "configs" / "demo.yaml"), help="demo recipe")
    p.add_argument("--workdir", default=str(REPO / ".cache" / "demo"))
    p.add_argument("--redis-url", default=REDIS_URL)
    p.add_argument("--base-port", type=int, default=51100)
    p.add_argument("--shape", choices=("demo", "long"), default="demo", help="demo/long_shape.py")
    p.add_argument("overrides", nargs="*", help="demo recipe overrides (key=value)")
    args = p.parse_args()

    with stdout_to_stderr():
        long = args.shape == "long"
        overrides = (long_shape.OVERRIDES if long else []) + list(args.overrides)
        cfg = recipe.load_recipe(DemoConfig, args.config, overrides)
        work = Path(args.workdir).resolve()
        if long:
            inputs = DemoInputs(*long_shape.make_inputs(work), accuracy=0.0)
        else:
            inputs = recipe.prepare_inputs(cfg, work)
        run_cfg = recipe.build_run_config(cfg, inputs)
        spec = recipe.cluster_spec(
            cfg,
            inputs,
            work,
            redis_url=args.redis_url,
            reward_port=args.base_port,
            learner_port=args.base_port + 1,
            rollout_base_port=args.base_port + 10,
            learner_overrides={"keep_weight_versions": 100_000},
            namespace=f"e2e-{os.getpid()}",
        )
        prompts = [json.loads(line) for line in inputs.data.read_text().splitlines()[:2000]]
        launched = time.monotonic()
        with Cluster(spec) as cluster:
            cluster_start_s = time.monotonic() - launched
            log(
                f"cluster ready in {cluster_start_s:.0f}s; RL {run_cfg.train.steps} steps, "
                f"N={run_cfg.sampling.n} x {run_cfg.train.groups_per_step} groups"
            )
            client = LearnerClient(cluster.learner_address)
            info = client.start(recipe.run_config_yaml(run_cfg), run_id=time.strftime("e2e-%H%M%S"))
            final = watch_run(client, info.run_id, info.total_steps, quiet=True)
            client.close()
            if final["state"] != "finished":
                raise SystemExit(f"run {final['state']}: {final['message']}")
            log("rollout alone ...")
            alone = rollout_alone(cluster, cfg, run_cfg, prompts, args.rollout_seconds)
            log("the worker loop alone ...")
            loop_alone, loop_generate = worker_loop_alone(
                args.redis_url, spec.namespace, run_cfg.model_copy(deep=True), args.worker_seconds
            )
        run_dir = Path(final["run_dir"])
        metrics = [
            json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        ]
        start = next(m["time"] for m in metrics if m.get("event") == "start")
        steps = [m for m in metrics if "learner/loss" in m]
        rl_s = steps[-1]["time"] - start
        generated = steps[-1]["rollout/generated"]

        evaluated = sorted(
            {
                min(s, len(steps))
                for s in range(args.eval_every, len(steps) + args.eval_every, args.eval_every)
            }
        )
        acc: dict[int, float] = {}
        if long:  # a random model: nothing to evaluate
            evaluated = []
        else:
            log(f"evaluating versions {evaluated} on {cfg.eval_problems} problems ...")
            acc = eval_versions(run_dir / "weights", inputs.model, evaluated, cfg.eval_problems)
        step_time = {int(m["step"]): m["time"] - start for m in steps}
        curve = [{"step": s, "rl_s": step_time[s], "accuracy": acc[s]} for s in evaluated]
        reached = next((c for c in curve if c["accuracy"] >= args.target), None)

        phases = step_phases(steps, loop_generate)
        compute = learner_compute(steps)
        params = _parameters(inputs.model)
        epochs, minibatches = run_cfg.train.passes()  # a pass reads each position once
        flops = 6 * params * epochs * compute.positions / max(compute.seconds, 1e-9)
        # the learner's threads: the standalone update's, its peak's, and the cores it runs on
        learner_threads = max(cfg.threads_per_process, 1)
        peak = peak_gemm_flops(learner_threads)
        completion, padded = compute.mean_completion, compute.padded_completion
        prompt_tokens = _prompt_tokens(inputs.model, prompts[0]["prompt"]) if long else 6
        log("the same update alone ...")
        alone_update = run_update(
            REPO,
            str(inputs.model),
            SimpleNamespace(
                threads=learner_threads,
                groups=run_cfg.train.groups_per_step,
                # the paths a group trains on (train.keep_paths of them, when it keeps fewer)
                n=min(run_cfg.sampling.n, run_cfg.train.keep_paths or run_cfg.sampling.n),
                steps=compute.standalone_updates,
                micro_batch=run_cfg.train.micro_batch_paths,
                # the run's shape: its prompt length, and completions as long as the run's on
                # average and padded as long as the run's micro-batches were
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_range(completion, padded),
                epochs=epochs,
                minibatches=minibatches,
                autocast=run_cfg.train.autocast,
            ),
        )
        # the same phases on both sides: forward + backward + optimizer (0: a revision without
        # them), summed over the timed updates as the pipeline's are (bench/pipeline/steps.py)
        alone_s = sum(alone_update["compute_seconds"]) or sum(alone_update["seconds"])
        alone_flops = (
            6 * params * epochs * alone_update["positions"] * len(alone_update["seconds"]) / alone_s
        )
        # the rate at which a learner that never waited would take what the rollout generates
        # (a step trains on fewer paths than were generated for it when groups are dropped)
        learner_alone = generated / len(steps) / statistics.fmean(alone_update["seconds"])
        steady = steady_rate(
            [m["time"] for m in steps], [m["rollout/generated"] for m in steps], generated / rl_s
        )
        machine = len(cluster.usable)
        engines = [c for name, c in cluster.cores.items() if name.startswith("rollout-")]
        rollout_cores = stage_cores(engines, cluster.threads or machine, machine)
        bound = work_bound(machine, rollout_cores, alone, learner_threads, learner_alone)
        generate = phases["rollout_generate_per_group"]
        reload_share = phases["rollout_reload_per_group"] / max(
            generate + phases["rollout_reload_per_group"], 1e-9
        )
    print(
        json.dumps(
            {
                "bench": "e2e",
                "overrides": args.overrides,
                "workers": cfg.workers,
                "n": run_cfg.sampling.n,
                "groups_per_step": run_cfg.train.groups_per_step,
                "shape": args.shape,
                "parameters": params,
                "mean_completion_tokens": completion,
                "steps": len(steps),
                "cluster_start_s": cluster_start_s,
                "rl_s": rl_s,
                "paths_per_s": generated / rl_s,
                "trained_paths_per_s": compute.paths / rl_s,
                "stale_paths": int(steps[-1].get("learner/dropped_paths/stale", 0)),
                "rollout_alone_paths_per_s": alone,
                "pipeline_ratio": generated / rl_s / alone,
                "learner_alone_paths_per_s": learner_alone,
                "bottleneck_ratio": generated / rl_s / min(alone, learner_alone),
                "steady_paths_per_s": steady,
                "steady_pipeline_ratio": steady / alone,
                "steady_bottleneck_ratio": steady / min(alone, learner_alone),
                "work_bound_paths_per_s": bound,
                "work_bound_ratio": generated / rl_s / bound,
                "steady_work_bound_ratio": steady / bound,
                "worker_alone_paths_per_s": loop_alone,
                "worker_pipeline_ratio": generated / rl_s / loop_alone,
                "steady_worker_pipeline_ratio": steady / loop_alone,
                "step_phases_s": phases,
                "learner_flops_over_peak": flops / peak,
                "learner_flops": flops,
                "learner_standalone_flops_over_peak": alone_flops / peak,
                "learner_in_pipeline_ratio": flops / alone_flops,
                "learner_update_runnable_share": compute.runnable_share,
                "learner_autocast": run_cfg.train.autocast,
                "learner_forward_dtype": forward_dtype(run_cfg.train.autocast),
                "learner_logp_gap": statistics.fmean(
                    [m["learner/logp_gap"] for m in steps if "learner/logp_gap" in m] or [0.0]
                ),
                "rollout_reload_share": reload_share,
                "peak_gemm_flops": peak,
                "warmstart_accuracy": inputs.accuracy,
                "accuracy_curve": curve,
                "target": args.target,
                "seconds_to_target": reached["rl_s"] if reached else None,
                "step_at_target": reached["step"] if reached else None,
            }
        )
    )


def completion_range(mean: float, padded: float) -> tuple[int, int]:
    """Completion lengths (lo, hi), drawn uniformly by the standalone update, whose longest is
    the run's padded length and whose mean is the run's mean: an update of a tiny model costs
    about the same per micro-batch whatever its length, so FLOP/s measured on longer synthetic
    completions than the run's would call the run's own update slow."""
    hi = max(round(padded), 1)
    return min(max(round(2 * mean - hi), 1), hi), hi


def _prompt_tokens(model_dir: Path, prompt: str) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(model_dir)(prompt)["input_ids"])


def _parameters(model_dir: Path) -> int:
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())


if __name__ == "__main__":
    main()
