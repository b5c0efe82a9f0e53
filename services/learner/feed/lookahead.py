"""The oldest weight version a group's paths may be sampled with (``PromptJob.min_weight_version``),
and whether its jobs can go out yet.

The learner judges a group by its version when it uses the group: paths of a version older than
that minus ``async.max_staleness`` are dropped as stale. The feed sends jobs ahead (up to
``async.max_inflight_groups``), and a worker with nothing else to do samples them at once with
whatever version is out. Where the learner is the slower stage, a group sent two steps ahead
was sampled with a version three behind the one that used it, and dropped: 896 of 3,968 paths
of the long shape (docs/performance.md). So each job names the version its group needs (the
one forecast to use it, minus ``max_staleness``), and a group whose version is not made yet is
held by the feed until it is: sent after the update that makes it, it is sampled with it. A
worker that takes such a job before the version reaches it waits for it
(services/rollout/worker.py ``await_version``); where the rollout is the slower stage the
version is long out by then and nothing waits.

The forecast assumes the learner uses groups in the order they were sent and drops none. A
group dropped ahead of this one (stale, all-equal) makes the update under way take one more,
so this one is used sooner, by an older version than forecast: it then asks for a newer
version than it needs and is held longer, never stale. The versions asked for are always made
already (with ``async.publish_lag`` L: the one L versions back that the workers get), so a
worker waits at most one publication, never for a version that needs its own group first; and
the update under way always has its groups sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from brorl.config.run import RunConfig


@dataclass(frozen=True)
class LearnerAt:
    """Where the learner stands when it sends jobs."""

    step: int  # updates done
    version: int  # its newest weight version (what a group used now is judged against)
    needed: int  # groups the update being collected still needs (a step's, between updates)


def use_version(at: LearnerAt, ahead: int, groups_per_step: int, publish_every: int) -> int:
    """The learner's version when it uses a group with ``ahead`` groups sent before it and not
    yet consumed: this update's while ``ahead`` < ``at.needed``, then one update later per
    ``groups_per_step`` groups; a version is made every ``publish_every`` updates."""
    updates = 0 if ahead < at.needed else 1 + (ahead - at.needed) // groups_per_step
    return at.version + (at.step + updates) // publish_every - at.step // publish_every


def min_weight_version(at: LearnerAt, ahead: int, cfg: RunConfig) -> int | None:
    """The oldest version whose paths the learner will not drop as stale when it uses the group
    (``use_version`` − ``max_staleness``, or − ``publish_lag`` when that is more: the workers get
    no newer one), 0 for any; None while that version is not made yet (the group waits)."""
    a = cfg.asynchrony
    used = use_version(at, ahead, cfg.train.groups_per_step, a.publish_every)
    oldest = max(0, used - max(a.max_staleness, a.publish_lag))
    return oldest if oldest <= max(at.version - a.publish_lag, 0) else None
