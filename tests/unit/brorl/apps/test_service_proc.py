"""ServiceProc, the tests' and benchmarks' way to start a service: each process gets one OpenMP
(torch) thread unless told otherwise, as the demo cluster's services do (threads_per_process).
At torch's default of one thread per core, with one of 2 cores busy, a learner beside a rollout
service took 50x as long for an update (brorl/apps/cluster/service_proc.py)."""

import time
from pathlib import Path

import pytest

from brorl.apps.cluster.service_proc import ServiceProc


def started_env(tmp_path: Path, **kwargs) -> dict[str, str]:
    """The environment the reward service's process was started with (read from /proc).

    Popen returns once exec has closed the child's close-on-exec pipe, which is before the
    kernel has laid out the new program's environment: read that soon, on a loaded machine,
    /proc/<pid>/environ can still be empty. So it is read until it is not."""
    proc = ServiceProc("reward", tmp_path, **kwargs)
    try:
        deadline = time.monotonic() + 30
        while not (raw := Path(f"/proc/{proc.pid}/environ").read_bytes()):
            assert proc.popen.poll() is None, proc.log()
            assert time.monotonic() < deadline, "the service's environment stayed empty"
            time.sleep(0.01)
    finally:
        proc.stop()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}


@pytest.fixture(autouse=True)
def no_inherited_thread_cap(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def test_a_service_gets_one_openmp_thread_by_default(tmp_path):
    assert started_env(tmp_path)["OMP_NUM_THREADS"] == "1"


def test_omp_threads_sets_the_count_and_zero_leaves_torch_its_default(tmp_path):
    assert started_env(tmp_path, omp_threads=2)["OMP_NUM_THREADS"] == "2"
    assert "OMP_NUM_THREADS" not in started_env(tmp_path, omp_threads=0)
