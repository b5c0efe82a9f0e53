"""The ids the learner gives its prompt jobs, their groups and prompts, made and read here only.

A training group is ``g<cursor>`` (the cursor counts the groups the job feed has enqueued, in
order; intake/seen_groups.py keeps the consumed ones as a watermark), its prompt ``p<index>`` (the
prompt's index in the training set), its jobs ``<run>/<epoch>/<cursor>/<part>`` (the epoch
changes with every learner process, so a resumed run's re-sent jobs are new jobs; a dead-lettered
job sent again gets ``/retry<n>``). A held-out
evaluation group is ``eval<step>.<i>`` with prompt ``e<i>``.
"""

from __future__ import annotations


def group_id(cursor: int) -> str:
    return f"g{cursor}"


def cursor_of(group_id: str) -> int:
    """``g17`` → 17; ValueError for an id the job feed did not make."""
    if not group_id.startswith("g") or not group_id[1:].isdigit():
        raise ValueError(f"group id {group_id!r} is not g<cursor>")
    return int(group_id[1:])


def prompt_id(index: int) -> str:
    return f"p{index}"


def prompt_index(prompt_id: str) -> int:
    """``p3`` → 3 (the training prompt a group sampled)."""
    if not prompt_id.startswith("p") or not prompt_id[1:].isdigit():
        raise ValueError(f"prompt id {prompt_id!r} is not p<index>")
    return int(prompt_id[1:])


def job_id(run_id: str, epoch: str, cursor: int, part: int) -> str:
    return f"{run_id}/{epoch}/{cursor}/{part}"


def retry_job_id(job_id: str, attempt: int) -> str:
    """A dead-lettered job sent again: a new job id, so publish-once takes its answer."""
    return f"{job_id}/retry{attempt}"


def eval_group_id(step: int, i: int) -> str:
    return f"eval{step}.{i}"


def eval_prompt_id(i: int) -> str:
    return f"e{i}"


def eval_job_id(run_id: str, epoch: str, group_id: str) -> str:
    return f"{run_id}/{epoch}/{group_id}"
