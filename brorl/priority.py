"""Background work below the rest on its core: the reward and environment services and a rollout
worker's tail process take a core's idle time, not the learner's update or an engine's sampling.

Why a process's nice value alone does nothing here: with the kernel's autogroups on
(``kernel.sched_autogroup_enabled = 1``, the default of these VMs) every session is a scheduling
group, and a core is shared between groups by the *group's* nice value
(``/proc/<pid>/autogroup``), not by their threads' values; the launcher starts every service in
a session of its own. So ``lower`` sets both: the process's own nice value (a kernel without
autogroups, threads inside one group) and, for a process that leads its session, its group's.
Measured (docs/performance.md, "priorities under the kernel's autogroups"): a process at nice 19
in its own session took the learner's core as an equal (the learner's training thread runnable
40% of its update); with its autogroup at nice 19, 6-7%. Off by default (the recipe's
``background_nice``): the tail and the reward service are on the rollout's critical path, and
where the rollout is the bound, waiting behind the learner's update cost demo_fast 12% of its
time to 63% (docs/performance.md, "Background work below the learner").
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

AUTOGROUPS = Path("/proc/sys/kernel/sched_autogroup_enabled")


def autogroups_on() -> bool:
    try:
        return AUTOGROUPS.read_text().strip() == "1"
    except OSError:  # a kernel built without them
        return False


def autogroup_nice(pid: int) -> int | None:
    """The nice value of ``pid``'s autogroup ("/autogroup-123 nice 19"), None without one."""
    try:
        return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def lower(pid: int, nice: int) -> bool:
    """Put process ``pid`` at ``nice`` (1-19; 0 leaves it): its own nice value,
    which its threads started afterwards inherit, and, when it leads its session, its
    autogroup's. Returns whether both took; a refusal (another user's process, a container's
    read-only /proc) is logged, never raised: a priority is an optimisation."""
    if not 0 <= nice <= 19:
        raise ValueError(f"nice {nice} is outside 0-19 (a higher value is a lower priority)")
    if pid <= 0:  # setpriority's 0 is the caller: never lower a process by mistake
        raise ValueError(f"no process {pid}")
    if nice == 0:
        return True
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
        if autogroups_on() and os.getsid(pid) == pid:
            Path(f"/proc/{pid}/autogroup").write_text(str(nice))
        return True
    except OSError as exc:
        log.warning("could not lower process %d to nice %d: %s", pid, nice, exc)
        return False


def own_session_below(nice: int) -> bool:
    """Lower this process, in a session (and so an autogroup) of its own, to ``nice``: a child
    that must not take its parent's group down with it. Returns ``lower``'s answer."""
    if nice and os.getsid(0) != os.getpid():
        try:
            os.setsid()  # leaves the parent's process group too: it is stopped by its pid
        except OSError as exc:  # a process group's leader cannot
            log.warning("could not start a session of its own: %s", exc)
    return lower(os.getpid(), nice)
