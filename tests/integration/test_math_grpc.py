"""math_answer through a real reward service on port 0: a hostile completion in a ScoreBatch gets
status timeout within its limit while the other paths of the batch are scored, the service stays
SERVING, and the next ScoreBatch is answered normally."""

import time

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from brorl import rpc
from brorl.contract import RewardStatus
from brorl.v1 import reward_pb2
from services.reward.config import RewardServiceConfig
from services.reward.server import SERVICE_NAME

from .conftest import reward_server

# Well above a normal comparison even on a loaded machine (a fresh worker's first comparisons have
# taken over 1 s while the suite's clusters ran beside it); the hostile item never finishes anyway.
LIMIT_S = 3.0
TOWER = "Hence the value is $\\boxed{9^{9^{9^{9}}}}$."


@pytest.fixture(scope="module")
def service():
    cfg = RewardServiceConfig(
        bind="127.0.0.1:0",
        functions={
            "math_answer": {"type": "math_answer", "timeout_s": LIMIT_S, "processes": 2},
            "gsm8k": {"type": "math_answer", "reference_kind": "solution"},
        },
    )
    with reward_server(cfg) as (server, stub):
        server.registry.get("math_answer")._workers().start()
        yield server, stub


@pytest.fixture(scope="module")
def slack(service) -> float:
    """Beyond the limit, what answering costs on this machine now (see test_math_hostile)."""
    _, stub = service
    times = []
    for _ in range(3):
        start = time.perf_counter()
        score(stub, "math_answer", [("so \\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}")])
        times.append(time.perf_counter() - start)
    return 1.0 + 3 * max(times)


def score(stub, fn, items):
    reqs = [
        reward_pb2.ScoreRequest(id=str(i), completion=c, reference=r)
        for i, (c, r) in enumerate(items)
    ]
    return stub.ScoreBatch(
        reward_pb2.ScoreBatchRequest(reward_fn=fn, items=reqs), timeout=60
    ).results


def serving(server) -> bool:
    with rpc.channel(f"127.0.0.1:{server.port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5
        )
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_hostile_path_times_out_and_the_service_answers_the_next_batch(service, slack):
    server, stub = service
    items = [("so \\boxed{\\frac{3}{4}}", "0.75"), (TOWER, "1"), ("The answer is 7.", "7")]
    start = time.perf_counter()
    results = score(stub, "math_answer", items)
    assert time.perf_counter() - start < LIMIT_S + slack
    assert [r.status for r in results] == [RewardStatus.OK, RewardStatus.TIMEOUT, RewardStatus.OK]
    assert [r.reward for r in results] == [1.0, 0.0, 1.0]
    assert "exceeded" in results[1].detail
    assert serving(server)
    again = score(stub, "math_answer", [("\\boxed{x^2+2x+1}", "(x+1)^2"), ("41", "42")])
    assert [(r.status, r.reward) for r in again] == [(RewardStatus.OK, 1.0), (RewardStatus.OK, 0.0)]


def test_identical_hostile_paths_in_one_batch_cost_one_limit(service, slack):
    server, stub = service
    server.registry.get("math_answer")._workers().start()
    start = time.perf_counter()
    results = score(stub, "math_answer", [(TOWER, "1")] * 64)
    assert time.perf_counter() - start < LIMIT_S + slack  # not 64 limits
    assert {r.status for r in results} == {RewardStatus.TIMEOUT}


def test_solution_references_through_the_service(service):
    _, stub = service
    solution = "Natalia sold 48/2 = 24 clips in May.\nAltogether 48+24 = 72 clips.\n#### 72"
    results = score(stub, "gsm8k", [("72", solution), ("So she sold 24.", solution)])
    assert [r.reward for r in results] == [1.0, 0.0]
