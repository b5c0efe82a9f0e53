"""Following a run on a learner: the progress bar of ``brorl run start --watch`` and ``brorl demo``,
and the silent wait of ``brorl sweep``. Shared by the commands so that none imports another."""

from __future__ import annotations

from brorl.client import LearnerClient

FINAL_EVENTS = ("done", "failed", "stopped")


def watch_run(client: LearnerClient, run_id: str, total: int, quiet: bool = False) -> dict:
    """Follow a run's metrics until it ends (with a tqdm bar unless ``quiet``); returns the final
    RunInfo as a dict: run_id, state, step, run_dir, message."""
    from tqdm import tqdm

    bar = tqdm(total=total, desc=run_id, unit="step", disable=quiet, dynamic_ncols=True)
    for m in client.watch(run_id):
        if m.event in FINAL_EVENTS:
            if m.event == "failed" and not quiet:
                bar.write(f"run failed: {m.message}")
            break
        if m.step > bar.n:
            bar.update(m.step - bar.n)
        v = m.values
        if "learner/reward_mean" in v:
            workers = sum(1 for k in v if k.startswith("rollout/paths_by/"))
            bar.set_postfix(
                # the step's sampled paths (the update's own may be a subset: train.keep_paths)
                reward=f"{v.get('reward/mean', v['learner/reward_mean']):.3f}",
                version=int(v.get("learner/weight_version", 0)),
                paths=int(v.get("rollout/paths", 0)),
                workers=workers,
                refresh=False,
            )
    bar.close()
    info = client.get(run_id)
    return {
        "run_id": info.run_id,
        "state": info.state,
        "step": info.step,
        "run_dir": info.run_dir,
        "message": info.message,
    }


def run_to_end(client: LearnerClient, config_yaml: str, run_id: str) -> tuple[str, list[dict]]:
    """Start a run, wait for it silently, and return its run_dir and metrics.jsonl records;
    a run that does not finish ends the command with its message (sweep and compare)."""
    import json
    from pathlib import Path

    info = client.start(config_yaml, run_id=run_id)
    final = watch_run(client, info.run_id, info.total_steps, quiet=True)
    if final["state"] != "finished":
        raise SystemExit(f"{run_id} {final['state']}: {final['message']}")
    lines = (Path(final["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    return final["run_dir"], [json.loads(line) for line in lines]
