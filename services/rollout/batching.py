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

MAX_CLAIM = 64  # jobs claimed at once, whatever the groups' width


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
