"""Which cores each process of a local cluster may run on.

Why the launcher pins its services: on the 2-core VMs brorl is developed on, the kernel packs
runnable threads onto as few vCPUs as it can (``sched_vcpu_pack`` on its command line). An
unpinned vLLM engine sampled at half speed beside a process pinned to the other core, and at full
speed once pinned itself; in the demo pipeline pinning made the learner's update and the run a
few percent faster (docs/performance.md, "A like-for-like standalone learner, and pinned
services"). vLLM's own binding (``VLLM_CPU_OMP_THREADS_BIND``) cannot do it for the default
in-process engine: it is applied by setting OpenMP's environment for vLLM's child processes, and
in the rollout service's own process OpenMP is already running by then.

The rule, from the recipe's ``rollout_cpu_bind`` and the cores this process may use:

* rollout worker i: its engine's cores: ``auto`` every core but the last (what vLLM's ``auto``
  picks: it keeps the last core free), ``spread`` the i-th core, a core list that list; a worker
  with more threads than those cores is not pinned (its OpenMP threads would take turns);
* reward and environment services: not pinned. A worker scores a call on its tail thread while
  its engine samples the next (services/rollout/tail/), so a reward service on the engine's
  core takes its time from sampling; the operating system puts it on whichever core is idle
  (in demo_fast the learner's, which waits for groups a third of a step; in a learner-bound run
  the engine's). Measured, demo_fast: 1,569 / 1,586 paths/s pinned to the worker's core, 1,628 /
  1,640 unpinned, 1,645 / 1,670 pinned to the learner's (docs/performance.md);
* learner: the cores no worker has, when there is one for each of its threads (ranks × torch
  threads; else unpinned: ranks squeezed onto fewer cores would wait for each other at every
  collective), and it may borrow the workers' cores while they have nothing to sample
  (``borrowable``: one rank only; services/learner/cores.py);
* ``nobind``: nothing is pinned (the operating system places every thread).

A process's threads inherit its affinity, so pinning the process right after it starts (before
it imports anything that starts threads) pins all of them.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

Cores = frozenset[int] | None  # None: not pinned


def parse_cores(spec: str) -> frozenset[int]:
    """``"0-2,5"`` → {0, 1, 2, 5}."""
    cores: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(cores)


def threads_each(cores: int, workers: int, learner_ranks: int = 1) -> int:
    """OpenMP threads of each service process when nobody says: the cores split evenly between
    the processes that compute (the rollout workers and the learner's ranks), at least one.

    Why not torch's default of one thread per core: processes that share cores, each with a
    thread per core, wait at every op for the thread that was descheduled. Measured, a cluster
    of one worker on 2 cores, one of them kept busy by other work, the learner's median update
    of the demo model: 25.8 s at the default, 0.53 s at one thread (docs/performance.md).
    """
    return max(1, cores // max(workers + learner_ranks, 1))


def worker_cores(mode: str, index: int, usable: list[int]) -> Cores:
    """The cores of rollout worker ``index`` under ``rollout_cpu_bind`` ``mode``, within
    ``usable`` (sorted); None for ``nobind`` or a list with none of the usable cores."""
    if mode == "nobind":
        return None
    if mode == "spread":
        return frozenset({usable[index % len(usable)]})
    if mode == "auto":
        return frozenset(usable[:-1] if len(usable) > 1 else usable)
    wanted = parse_cores(mode)
    if wanted - frozenset(usable):
        log.warning(
            "rollout_cpu_bind %r names cores this process may not use (%s); usable: %s",
            mode,
            sorted(wanted - frozenset(usable)),
            usable,
        )
    return wanted & frozenset(usable) or None


def placement(
    mode: str,
    workers: int,
    usable: list[int],
    worker_threads: int = 1,
    learner_threads: int = 1,
) -> dict[str, Cores]:
    """Service name (``rollout-<i>``, ``reward``, ``env``, ``learner``) → its cores, for workers
    of ``worker_threads`` OpenMP threads each and a learner of ``learner_threads`` in all."""
    usable = sorted(usable)
    out: dict[str, Cores] = {}
    for i in range(workers):
        cores = worker_cores(mode, i, usable)
        out[f"rollout-{i}"] = cores if cores and len(cores) >= worker_threads else None
    pinned = [c for c in out.values() if c is not None]
    rest = frozenset(usable) - frozenset().union(*pinned)
    # no worker pinned: the learner is not pinned either (it would be all cores anyway)
    learner = rest if pinned and len(rest) >= max(learner_threads, 1) else None
    return {**out, "reward": None, "env": None, "learner": learner}


def borrowable(cores: dict[str, Cores], learner_overrides: dict) -> list[int]:
    """The cores the learner may borrow while the workers have nothing to sample (the learner's
    ``borrow_cores``, services/learner/cores.py): the pinned workers', when the learner is
    pinned apart from them and runs one rank."""
    if cores.get("learner") is None or int(learner_overrides.get("ranks") or 1) > 1:
        return []
    workers = [c for name, c in cores.items() if name.startswith("rollout-") and c is not None]
    return sorted(frozenset().union(*workers) - cores["learner"]) if workers else []


def background(cores: dict[str, Cores], service: str, usable: list[int]) -> list[int]:
    """The cores a pinned worker's weight fetch and staging may run on besides its own (the
    rollout service's ``background_cores``): the others this cluster uses. Staging a version
    beside a call on the engine's own core would take its time from sampling."""
    own = cores.get(service)
    return sorted(frozenset(usable) - own) if own is not None else []


def pin(pid: int, cores: Cores) -> None:
    """Restrict process ``pid`` (its threads to come with it) to ``cores``; None: leave it."""
    if cores is None:
        return
    try:
        os.sched_setaffinity(pid, cores)
    except OSError as exc:  # gone already, or cores this machine does not have
        log.warning("could not pin pid %d to cores %s: %s", pid, sorted(cores), exc)
