"""How the rollout worker puts several prompt jobs into one engine call.

vLLM decodes the sequences of a call together, up to ``engine.max_num_seqs`` a step, and on a
CPU a step of a small model costs about the same for 64 sequences as for 512 (the scheduler and
the Python around the model dominate). A group of N = 64 sampled alone therefore leaves most of
the engine's width unused, and narrow-group recipes paid for it in every step
(docs/performance.md "Several groups in one engine call"). So the worker claims as many jobs as
fill ``batch_paths`` candidates and samples those that share their sampling settings in one call;
their paths are scored in one request, and each job is still selected and published (acked) on
its own.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from brorl import sampling
from brorl.v1 import common_pb2

MAX_CLAIM = 64  # jobs claimed at once, whatever the groups' width


def claim(queue, count: int, batch_paths: int, block_ms: int = 500) -> list:
    """Up to ``count`` jobs from ``queue`` (a StreamQueue), waiting up to ``block_ms`` for the
    first; then, without waiting, as many more as are queued and fill ``batch_paths`` at the
    first job's width. ``count`` is what the worker learned from its last call, 1 when a run
    starts; the learner enqueues a run's first jobs together (JobFeed.top_up), so the run's
    first call holds a step's groups too, not the first job alone."""
    claimed = queue.read(count=count, block_ms=block_ms)
    width = job_width(claimed[0].data) if claimed else 0
    more = claim_count(batch_paths, width) - len(claimed) if width else 0
    return claimed + (queue.read(count=more, block_ms=None) if more > 0 else [])


def job_width(data: bytes) -> int:
    """``width`` of a serialized PromptJob; 0 for bytes that are no job."""
    try:
        return width(common_pb2.PromptJob.FromString(data))
    except DecodeError:
        return 0


def width(job: common_pb2.PromptJob) -> int:
    """Candidates the engine samples for ``job`` in a shared call (its ``n`` there); 0 for a job
    that is not sampled in one (an environment's episodes run turn by turn)."""
    return 0 if job.env.address else sampling.candidates(job)


def claim_count(batch_paths: int, candidates: int, most: int = MAX_CLAIM) -> int:
    """Jobs to claim next so that their candidates fill ``batch_paths``, from the candidates of
    the last job seen (a run's groups are mostly alike): at least 1, at most ``most``."""
    return max(1, min(most, batch_paths // max(candidates, 1)))


def calls(settings: list[dict]) -> list[tuple[dict, list[int]]]:
    """The engine calls for jobs with these engine settings (n included): the indices of the jobs
    whose settings are equal, one call each, in the order of each call's first job."""
    out: dict[str, tuple[dict, list[int]]] = {}
    for i, kwargs in enumerate(settings):
        key = repr(sorted(kwargs.items()))  # values may be lists (stop strings)
        out.setdefault(key, (kwargs, []))[1].append(i)
    return list(out.values())


def shares(seconds: float, sizes: list[int]) -> list[float]:
    """A call's wall-clock split over its jobs by the paths each sampled, so that the seconds of
    a step's groups still add up to the time spent sampling them."""
    total = sum(sizes)
    if total <= 0:
        return [seconds / max(len(sizes), 1)] * len(sizes)
    return [seconds * size / total for size in sizes]
