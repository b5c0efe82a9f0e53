"""Which cores the local cluster's services run on (brorl/apps/cluster/placement.py)."""

from __future__ import annotations

import os
import sys

import pytest

from brorl import priority
from brorl.apps.cluster import placement
from brorl.apps.cluster.launcher import Cluster, ClusterSpec


def test_auto_on_two_cores_gives_the_worker_core_0_and_the_learner_core_1():
    cores = placement.placement("auto", 1, [0, 1])
    # the reward and environment services work beside the engine (a call's tail overlaps the
    # next call): they go wherever a core is idle
    assert cores == {"rollout-0": {0}, "reward": None, "env": None, "learner": {1}}


def test_auto_keeps_the_last_usable_core_for_the_learner_whatever_the_numbering():
    cores = placement.placement("auto", 2, [7, 3, 5])
    assert cores["rollout-0"] == cores["rollout-1"] == {3, 5}
    assert cores["reward"] is None
    assert cores["learner"] == {7}


def test_spread_gives_worker_i_the_ith_core_and_leaves_the_learner_unpinned_when_none_is_left():
    cores = placement.placement("spread", 3, [0, 1])
    assert [cores[f"rollout-{i}"] for i in range(3)] == [{0}, {1}, {0}]
    # every core has a worker: the helpers and the learner may run anywhere
    assert cores["reward"] is None and cores["learner"] is None


def test_spread_with_spare_cores_gives_them_to_the_learner():
    cores = placement.placement("spread", 2, [0, 1, 2, 3])
    assert cores["reward"] is None
    assert cores["learner"] == {2, 3}


def test_a_learner_of_several_threads_is_pinned_only_where_each_gets_a_core():
    assert placement.placement("auto", 1, [0, 1], learner_threads=2)["learner"] is None
    assert placement.placement("0", 1, [0, 1, 2], learner_threads=2)["learner"] == {1, 2}
    assert placement.placement("0", 1, [0, 1, 2], learner_threads=3)["learner"] is None


def test_a_pinned_learner_of_one_rank_may_borrow_the_workers_cores():
    auto = placement.placement("auto", 2, [7, 3, 5])
    assert placement.borrowable(auto, {}) == [3, 5]
    spread = placement.placement("spread", 2, [0, 1, 2, 3])
    assert placement.borrowable(spread, {"torch_threads": 2}) == [0, 1]
    assert placement.borrowable(spread, {"ranks": 2}) == []  # ranks' threads are not moved
    # an unpinned learner (no core left for it), nobind, a worker too wide to pin: nothing
    assert placement.borrowable(placement.placement("spread", 3, [0, 1]), {}) == []
    assert placement.borrowable(placement.placement("nobind", 1, [0, 1]), {}) == []
    wide = placement.placement("auto", 1, [0, 1, 2], worker_threads=3)
    assert placement.borrowable(wide, {}) == []


def test_a_pinned_workers_weight_staging_may_use_the_clusters_other_cores():
    auto = placement.placement("auto", 1, [0, 1])
    assert placement.background(auto, "rollout-0", [0, 1]) == [1]
    spread = placement.placement("spread", 2, [2, 4, 6])
    assert placement.background(spread, "rollout-1", [2, 4, 6]) == [2, 6]
    unpinned = placement.placement("nobind", 1, [0, 1])
    assert placement.background(unpinned, "rollout-0", [0, 1]) == []  # it has them all


def test_a_worker_with_more_threads_than_its_cores_is_not_pinned():
    cores = placement.placement("auto", 1, [0, 1], worker_threads=2, learner_threads=2)
    assert set(cores.values()) == {None}
    cores = placement.placement("spread", 2, [0, 1, 2, 3], worker_threads=2)
    assert cores["rollout-0"] is None and cores["rollout-1"] is None


def test_a_core_list_is_cut_to_the_usable_cores(caplog):
    cores = placement.placement("0-2,9", 1, [1, 2, 3])
    assert "names cores this process may not use ([0, 9])" in caplog.text
    assert cores["rollout-0"] == {1, 2}
    assert cores["learner"] == {3}
    # a list naming no usable core pins nothing
    assert placement.placement("8", 1, [0, 1])["learner"] is None


def test_nobind_and_a_single_core_machine_pin_nothing_anyone_could_not_share():
    assert set(placement.placement("nobind", 2, [0, 1]).values()) == {None}
    one = placement.placement("auto", 1, [4])
    assert one["rollout-0"] == {4} and one["learner"] is None and one["reward"] is None


@pytest.mark.parametrize(
    "cores,workers,ranks,threads",
    [(2, 1, 1, 1), (2, 2, 1, 1), (16, 2, 1, 5), (16, 3, 2, 3), (8, 0, 1, 8), (1, 4, 1, 1)],
)
def test_unless_told_each_process_gets_an_even_share_of_the_cores(cores, workers, ranks, threads):
    assert placement.threads_each(cores, workers, ranks) == threads


def test_the_launcher_gives_its_children_the_thread_count_it_resolved(tmp_path, monkeypatch):
    usable = len(os.sched_getaffinity(0))
    monkeypatch.setattr(Cluster, "ensure_redis", lambda self: None)
    monkeypatch.setattr(Cluster, "wait_ready", lambda self, timeout=0: None)
    envs = {}
    monkeypatch.setattr(
        "subprocess.Popen",
        lambda argv, env, **kw: envs.update({argv[2]: env}) or type("P", (), {"pid": 0})(),
    )
    monkeypatch.setattr(placement, "pin", lambda pid, cores: None)
    monkeypatch.setattr(priority, "lower", lambda pid, nice: True)  # the fake children's pid 0

    def started(**spec) -> tuple[int, set]:
        envs.clear()
        c = Cluster(ClusterSpec(model="-", workdir=tmp_path, rollout_workers=1, **spec))
        c.start()
        return c.threads, {e.get("OMP_NUM_THREADS") for e in envs.values()}

    even = max(1, usable // 2)  # one worker and one learner rank
    assert started() == (even, {str(even)})
    assert started(threads_per_process=3) == (3, {"3"})
    # 0: every service keeps the variable the launcher was started with (torch's default)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert started(threads_per_process=0) == (0, {None})


@pytest.mark.parametrize("text,cores", [("3", {3}), ("0-2", {0, 1, 2}), ("5,1-2", {1, 2, 5})])
def test_parse_cores(text, cores):
    assert placement.parse_cores(text) == cores


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores")
def test_a_spawned_process_and_the_threads_it_starts_run_on_the_cores_it_was_given(tmp_path):
    core = min(os.sched_getaffinity(0))
    cluster = Cluster(ClusterSpec(model="-", workdir=tmp_path))
    code = (
        "import os, threading, time\n"
        "seen = []\n"
        "t = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))\n"
        "t.start(); t.join()\n"
        "print(sorted(os.sched_getaffinity(0)), sorted(seen[0]), flush=True)\n"
    )
    proc = cluster._spawn("probe", [sys.executable, "-c", code], frozenset({core}))
    try:
        assert proc.popen.wait(timeout=30) == 0
    finally:
        cluster.stop()
    assert proc.log_path.read_text().split("\n")[0] == f"[{core}] [{core}]"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores")
def test_the_launcher_lends_the_workers_cores_to_a_pinned_learner(tmp_path, monkeypatch):
    usable = sorted(os.sched_getaffinity(0))
    spawned = {}
    monkeypatch.setattr(Cluster, "ensure_redis", lambda self: None)
    monkeypatch.setattr(Cluster, "wait_ready", lambda self, timeout=0: None)
    monkeypatch.setattr(
        Cluster, "_spawn", lambda self, name, argv, cores=None, nice=0: spawned.update({name: argv})
    )

    def learner_arg(**spec) -> str:
        spawned.clear()
        Cluster(ClusterSpec(model="-", workdir=tmp_path, threads_per_process=1, **spec)).start()
        [arg] = [a for a in spawned["learner"] if a.startswith("borrow_cores=")]
        return arg

    assert learner_arg() == f"borrow_cores={usable[:-1]}"  # auto: the worker has all but one
    assert learner_arg(rollout_cpu_bind="nobind") == "borrow_cores=[]"
    assert learner_arg(learner_overrides={"ranks": 2}) == "borrow_cores=[]"


def test_the_launcher_puts_background_work_below_the_rest(tmp_path, monkeypatch):
    """The reward service's autogroup is lowered once it starts; a worker's tail process is
    lowered where it runs on background cores, never beside its own engine."""
    cluster = Cluster(ClusterSpec(model="-", workdir=tmp_path, background_nice=17))
    code = "import time; time.sleep(60)"
    proc = cluster._spawn("probe", [sys.executable, "-c", code], None, nice=17)
    try:
        assert os.getpriority(os.PRIO_PROCESS, proc.popen.pid) == 17
        if priority.autogroups_on():
            assert priority.autogroup_nice(proc.popen.pid) == 17
    finally:
        cluster.stop()
    spawned, lowered = {}, {}
    monkeypatch.setattr(Cluster, "ensure_redis", lambda self: None)
    monkeypatch.setattr(Cluster, "wait_ready", lambda self, timeout=0: None)
    monkeypatch.setattr(
        Cluster,
        "_spawn",
        lambda self, name, argv, cores=None, nice=0: (
            spawned.update({name: argv}) or lowered.update({name: nice})
        ),
    )

    def started(**spec) -> tuple[dict, str]:
        spawned.clear()
        lowered.clear()
        Cluster(ClusterSpec(model="-", workdir=tmp_path, threads_per_process=1, **spec)).start()
        [tail] = [a for a in spawned["rollout-0"] if a.startswith("tail_nice=")]
        return lowered, tail

    nice, tail = started(environment={"env": "calculator"}, background_nice=19)
    assert (nice["reward"], nice["env"], nice["learner"], nice["rollout-0"]) == (19, 19, 0, 0)
    if len(os.sched_getaffinity(0)) > 1:  # the worker pinned, the learner's cores its background
        assert tail == "tail_nice=19"
    # no background cores: the tail beside its engine, never below it
    assert started(rollout_cpu_bind="nobind", background_nice=19)[1] == "tail_nice=0"
    assert started() == ({n: 0 for n in nice if n != "env"}, "tail_nice=0")  # off by default
