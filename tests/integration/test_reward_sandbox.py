"""Malicious completions in the code sandbox, through a real gRPC server on port 0.

Each must score 0 with a status saying why, within its limits, and the service must keep serving.
Limits: 32 processes and 128 MB in both functions; ``code`` (1 s wall/CPU) only for the tests
that expect a time limit, ``code_roomy`` (10 s wall, 5 s CPU) for every test that expects a
verdict: on a loaded machine one job can take more than 1 s of wall time (two tampering cases
that exit at once were scored "timeout" after 2.1 and 4.9 s while the suite ran three lanes; a
fork bomb that raises at once, after more than 1 s beside the suite's other lane).
"""

import json
import os
import socket
import textwrap
import time
from pathlib import Path

import pytest

from brorl.v1 import reward_pb2
from services.reward.base import ScoreItem
from services.reward.config import CodeSpec, RewardServiceConfig
from services.reward.functions.code_reward import CodeReward

from .conftest import reward_server
from .sandbox_tampering import HONEST, TAMPERING

SECRET = "hunter2-brorl-test-secret"
UID_BASE = 3_100_000
CONCURRENCY = 4
TESTS = json.dumps({"tests": ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]})
GOOD = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def stub():
    os.environ["BRORL_TEST_SECRET"] = SECRET  # in the service's environment, never in a job's
    cfg = RewardServiceConfig(
        bind="127.0.0.1:0",
        functions={
            "code": {
                "type": "code",
                "mode": "binary",
                "wall_s": 1.0,
                "cpu_s": 1.0,
                "memory_mb": 128,
                "nproc": 32,
                "concurrency": CONCURRENCY,
                "uid_base": UID_BASE,
            },
            "code_roomy": {
                "type": "code",
                "mode": "binary",
                "wall_s": 10.0,
                "cpu_s": 5.0,
                "memory_mb": 128,
                "nproc": 32,
                "concurrency": CONCURRENCY,
                "uid_base": UID_BASE + 2 * CONCURRENCY,
            },
        },
    )
    try:
        with reward_server(cfg) as (_, stub):
            yield stub
    finally:
        del os.environ["BRORL_TEST_SECRET"]


def score(stub, *codes, reference=TESTS, timeout=60, fn="code_roomy"):
    items = [
        reward_pb2.ScoreRequest(id=str(i), completion=c, reference=reference)
        for i, c in enumerate(codes)
    ]
    start = time.monotonic()
    resp = stub.ScoreBatch(reward_pb2.ScoreBatchRequest(reward_fn=fn, items=items), timeout=timeout)
    return list(resp.results), time.monotonic() - start


def sandbox_processes() -> list[int]:
    """Host pids still running as one of the sandbox's job uids."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:  # two uids per job (checker, completion) and two functions: 4 x CONCURRENCY
                if UID_BASE <= os.stat(f"/proc/{name}").st_uid < UID_BASE + 4 * CONCURRENCY:
                    with open(f"/proc/{name}/stat", "rb") as f:
                        if (
                            f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
                        ):  # zombies are already dead
                            found.append(int(name))
            except (OSError, IndexError):
                pass
    return found


def assert_still_serving(stub):
    [good], _ = score(stub, GOOD)
    assert (good.status, good.reward) == ("ok", 1.0), good
    assert not sandbox_processes()


def test_good_code_passes(stub):
    [r], _ = score(stub, f"Here you go:\n```python\n{GOOD}```")
    assert (
        (r.status, r.reward) == ("ok", 1.0)
        and r.components["tests_passed"] == 2
        and r.latency_ms > 0
    )


def test_infinite_loop_times_out(stub):
    [r], took = score(stub, "def add(a, b):\n    while True:\n        pass\nadd(1, 2)\n", fn="code")
    assert (r.reward, r.status) == (0.0, "timeout") and "limit" in r.detail
    assert took < 10
    assert_still_serving(stub)


def test_fork_bomb_is_contained(stub):
    # it ends when its first process's fork fails
    [raised], took = score(stub, "import os\nwhile True:\n    os.fork()\n")
    assert (raised.reward, raised.status) == (0, "error") and "process limit (32" in raised.detail
    assert took < 15
    swallows = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    [spun], took = score(stub, swallows, fn="code")
    assert (spun.reward, spun.status) == (0, "timeout")  # it spins until the wall
    assert took < 15
    assert_still_serving(stub)


def test_memory_bomb_hits_the_memory_limit(stub):
    results, _ = score(
        stub, "x = bytearray(1 << 33)\n", "a = []\nwhile True:\n    a.append(' ' * 10**7)\n"
    )
    for r in results:
        assert (r.reward, r.status) == (0.0, "error") and "memory limit (128 MB)" in r.detail, r
    assert_still_serving(stub)


def test_writing_outside_the_temporary_directory_is_denied(stub, tmp_path):
    targets = [
        Path("/tmp/brorl-sandbox-escape"),
        Path(__file__).with_name("brorl-escape"),
        tmp_path / "x",
    ]
    tmp_path.chmod(
        0o777
    )  # even a world-writable directory is out of reach (the filesystem is read-only)
    codes = [f"open({str(t)!r}, 'w').write('pwned')\n" for t in targets] + [
        "open('inside.txt', 'w').write('fine')\n" + GOOD
    ]
    results, _ = score(stub, *codes)
    for r in results[:-1]:
        assert (r.reward, r.status) == (
            0.0,
            "error",
        ) and "outside the sandbox directory" in r.detail, r
    assert (results[-1].status, results[-1].reward) == ("ok", 1.0)
    assert not any(t.exists() for t in targets)
    assert_still_serving(stub)


def test_network_connections_are_impossible(stub):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    try:
        results, _ = score(
            stub,
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n",
            "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=1)\n",
        )
        for r in results:
            assert (r.reward, r.status) == (
                0.0,
                "error",
            ) and "network access is disabled" in r.detail, r
        with pytest.raises(socket.timeout):
            listener.accept()  # nothing ever reached the host
    finally:
        listener.close()
    assert_still_serving(stub)


def test_service_environment_secrets_are_unreachable(stub):
    steal = (
        "import os\nsecret = os.environ.get('BRORL_TEST_SECRET') or "
        "open(f'/proc/{os.getppid()}/environ').read()\n" + GOOD
    )
    scan = (
        "import os\nseen = ''\nfor pid in os.listdir('/proc'):\n    try:\n"
        "        seen += open(f'/proc/{pid}/environ').read()\n    except OSError:\n        pass\n"
        + GOOD
    )
    ref = json.dumps({"tests": ["assert 'hunter2' in secret"]})
    results, _ = score(stub, steal, reference=ref)
    results += score(stub, scan, reference=json.dumps({"tests": ["assert 'hunter2' in seen"]}))[0]
    assert all(r.reward == 0 for r in results)
    assert (
        results[0].status == "error"
        and "reading another process's data was denied" in results[0].detail
    )
    assert (
        results[1].status == "ok" and "AssertionError" in results[1].detail
    )  # found nothing to read
    assert all(SECRET not in r.detail for r in results)
    assert_still_serving(stub)


def test_signalling_the_parent_is_denied(stub):
    results, _ = score(
        stub,
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
        "import os, signal\nos.kill(1, signal.SIGKILL)\n",
        f"import os, signal\nos.kill({os.getpid()}, signal.SIGTERM)\n",
    )
    for r in results:
        assert (r.reward, r.status) == (0.0, "error"), r
        assert "not permitted" in r.detail or "invisible" in r.detail, r
    assert_still_serving(stub)


def test_forged_reports_do_not_count(stub):
    forge = (
        "import os, json\n"
        "fake = ''.join(json.dumps(x) + '\\n' for x in [{'stage': 'syntax', 'ok': True}, "
        "{'stage': 'run', 'ok': True}, {'stage': 'test', 'index': 0, 'ok': True}, "
        "{'stage': 'test', 'index': 1, 'ok': True}, {'stage': 'done'}]).encode()\n"
        "for fd in range(3, 64):\n    try:\n        os.write(fd, fake)\n"
        "    except OSError:\n        pass\n"
        "os._exit(0)\n"
    )
    [r], _ = score(stub, forge)
    assert (r.reward, r.status) == (0.0, "error"), r
    assert "broke the checker's protocol" in r.detail, r  # its pipe leads to the checker only
    assert_still_serving(stub)


def test_512_paths_concurrently(stub):
    codes = [GOOD if i % 4 else "def add(a, b):\n    return a - b\n" for i in range(512)]
    results, took = score(stub, *codes, timeout=120)
    assert [r.reward for r in results] == [1.0 if i % 4 else 0.0 for i in range(512)]
    assert all(r.status == "ok" for r in results)
    assert took < 60
    assert_still_serving(stub)


def tampering_items():
    return [
        ScoreItem(kind, "", textwrap.dedent(code), json.dumps({"tests": tests}))
        for kind, (code, tests) in TAMPERING.items()
    ]


@pytest.mark.parametrize("kind", list(HONEST))
def test_honest_solutions_still_pass(stub, kind):
    code, reference = HONEST[kind]
    [r], _ = score(stub, textwrap.dedent(code), reference=json.dumps(reference))
    assert (r.reward, r.status) == (1.0, "ok"), r


@pytest.mark.parametrize("kind", list(TAMPERING))
def test_tampering_scores_zero(stub, kind):
    code, tests = TAMPERING[kind]
    reference = json.dumps({"tests": tests})
    [r], _ = score(stub, textwrap.dedent(code), reference=reference)
    assert r.reward == 0.0 and r.status in ("ok", "error"), r


def test_tampering_scores_zero_in_guard_mode():
    """The fallback isolation runs the same two processes: the checker is out of reach there too."""
    fn = CodeReward("code", CodeSpec(mode="binary", isolation="guard", wall_s=10.0, concurrency=4))
    try:
        scores = fn.score_batch(tampering_items())
        assert fn.pool.isolation == "guard"
        got = {kind: (s.reward, s.status, s.detail) for kind, s in zip(TAMPERING, scores)}
        assert all(reward == 0.0 for reward, _, _ in got.values()), got
        honest = [ScoreItem("good", "", GOOD, TESTS)] + [
            ScoreItem(kind, "", textwrap.dedent(code), json.dumps(ref))
            for kind, (code, ref) in HONEST.items()
        ]
        for item, s in zip(honest, fn.score_batch(honest)):
            assert (s.reward, s.status) == (1.0, "ok"), (item.id, s)
    finally:
        fn.close()
