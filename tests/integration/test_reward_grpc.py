"""The reward service through a real gRPC server on port 0: names, errors, statuses, batches."""

import grpc
import pytest

from brorl.v1 import reward_pb2
from services.reward.config import RewardServiceConfig

from .conftest import reward_server


@pytest.fixture(scope="module")
def stub():
    cfg = RewardServiceConfig(
        bind="127.0.0.1:0",
        max_batch=600,
        functions={
            "rlhf_mix": {
                "type": "composite",
                "components": {"relevance": 0.5, "safety": 0.3, "diversity": 0.2},
            },
            "gated_math": {
                "type": "pipeline",
                "gates": {"format": 1.0},
                "scorer": "math_answer",
                "sensitive_words": ["forbidden"],
                "fail_reward": -1.0,
            },
        },
    )
    with reward_server(cfg) as (_, stub):
        yield stub


def batch(stub, fn, items, timeout=30):
    reqs = [
        reward_pb2.ScoreRequest(id=str(i), prompt=p, completion=c, reference=r)
        for i, (p, c, r) in enumerate(items)
    ]
    return stub.ScoreBatch(
        reward_pb2.ScoreBatchRequest(reward_fn=fn, items=reqs), timeout=timeout
    ).results


def test_rollout_worker_contract_math_answer(stub):
    results = batch(stub, "math_answer", [("47+385=", "432", "432"), ("1+1=", "3", "2")] * 256)
    assert len(results) == 512
    assert [r.reward for r in results[:2]] == [1.0, 0.0]
    assert all(r.status == "ok" and r.latency_ms >= 0 for r in results)
    assert [r.id for r in results[:3]] == ["0", "1", "2"]


def test_every_default_family_is_reachable_by_name(stub):
    names = {
        f.name
        for f in stub.ListRewardFunctions(
            reward_pb2.ListRewardFunctionsRequest(), timeout=5
        ).functions
    }
    assert {
        "math_answer",
        "format",
        "code",
        "relevance",
        "safety",
        "diversity",
        "rlhf_mix",
        "gated_math",
    } <= names
    [r] = batch(
        stub,
        "rlhf_mix",
        [("What is the capital of France?", "Paris is the capital of France.", "")],
    )
    assert set(r.components) == {"relevance", "safety", "diversity"} and r.status == "ok"
    assert r.reward == pytest.approx(
        0.5 * r.components["relevance"]
        + 0.3 * r.components["safety"]
        + 0.2 * r.components["diversity"],
        rel=1e-5,
    )
    [r] = batch(stub, "composite:safety=1,diversity=1", [("", "a calm and varied sentence", "")])
    assert r.reward == pytest.approx(2.0)


def test_pipeline_statuses(stub):
    ok, early, filtered = batch(
        stub,
        "gated_math",
        [("q", "\\boxed{12}", "12"), ("q", "it is 12", "12"), ("q", "forbidden 12", "12")],
    )
    assert (ok.status, ok.reward) == ("ok", 1.0)
    assert (early.status, early.reward) == (
        "ok",
        -1.0,
    ) and "early exit at gate format" in early.detail
    assert (filtered.status, filtered.reward) == ("filtered", 0.0)


def test_single_score_rpc(stub):
    r = stub.Score(
        reward_pb2.ScoreRequest(
            reward_fn="math_answer", id="x", completion="\\boxed{1/2}", reference="0.5"
        ),
        timeout=10,
    )
    assert (r.id, r.reward, r.status) == ("x", 1.0, "ok")


@pytest.mark.parametrize(
    "fn,code,fix",
    [
        (
            "no_such_fn",
            grpc.StatusCode.INVALID_ARGUMENT,
            "unknown reward function 'no_such_fn'; available:",
        ),
        ("", grpc.StatusCode.INVALID_ARGUMENT, "name a function"),
        (
            "composite:relevance=abc",
            grpc.StatusCode.INVALID_ARGUMENT,
            "weight of 'relevance' must be a number",
        ),
        (
            "composite:relevance=0,safety=0",
            grpc.StatusCode.INVALID_ARGUMENT,
            "give at least one component a non-zero",
        ),
        ("composite:relevance", grpc.StatusCode.INVALID_ARGUMENT, "has no weight"),
        ("composite:nope=1", grpc.StatusCode.INVALID_ARGUMENT, "['nope'] unknown; available"),
    ],
)
def test_bad_names_and_weights_are_invalid_argument(stub, fn, code, fix):
    with pytest.raises(grpc.RpcError) as err:
        batch(stub, fn, [("q", "1", "1")])
    assert err.value.code() == code and fix in err.value.details()


def test_oversized_batch_is_resource_exhausted(stub):
    with pytest.raises(grpc.RpcError) as err:
        batch(stub, "math_answer", [("q", "1", "1")] * 601)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_batch=600" in err.value.details() and "split it" in err.value.details()
    assert len(batch(stub, "math_answer", [("q", "1", "1")] * 600)) == 600  # still serving


def test_bad_reference_is_a_per_path_error_not_a_failed_call(stub):
    good, bad = batch(
        stub,
        "code",
        [
            ("", "def f():\n    return 1\n", '{"tests": ["assert f() == 1"]}'),
            ("", "def f():\n    return 1\n", '{"tests": []}'),
        ],
    )
    assert (good.status, good.reward) == ("ok", 1.0)
    assert bad.status == "error" and "no tests" in bad.detail
