"""The PathGroup messages a rollout worker publishes for a job: a scored group (its kept paths,
what sampling and scoring them cost, the selection's and the engine's statistics), or an empty
group carrying the engine's refusal of the prompt (e.g. longer than the context), which the
learner counts at once and moves on from."""

from __future__ import annotations

from brorl.v1 import common_pb2


def fields(run_id: str, job: common_pb2.PromptJob, version: int, worker: str) -> dict:
    """What every group of ``job`` carries, scored or not."""
    return dict(
        run_id=run_id,
        group_id=job.group_id,
        prompt_id=job.prompt_id,
        prompt=job.prompt,
        reference=job.reference,
        weight_version=version,
        worker=worker,
        part_index=job.part_index,
        part_count=job.part_count,
        eval=job.eval,
        extra=job.extra,
    )


def scored(common: dict, gen, chosen, paths, between: dict) -> common_pb2.PathGroup:
    """A scored group: ``gen`` the engine's Generated, ``chosen`` its Selection, ``paths`` the
    kept ones with their rewards, ``between`` the worker's time since its previous job."""
    return common_pb2.PathGroup(
        **common,
        prompt_token_ids=gen.prompt_ids,
        paths=paths,
        generate_seconds=gen.seconds["generate"],
        score_seconds=gen.seconds["score"],
        generated=len(gen.samples),
        dropped=chosen.dropped,
        stats={**chosen.stats, **between, **gen.phases},
    )


def refused(common: dict, reason: str) -> common_pb2.PathGroup:
    return common_pb2.PathGroup(**common, error=reason[:1000])
