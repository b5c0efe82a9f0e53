"""The contract as a client in another language sees it: real service processes, reflection
only (no brorl stubs) for Generate and ScoreBatch, and bad input → INVALID_ARGUMENT naming
the field (a path outside the learner's read_roots: PERMISSION_DENIED), with the service still
serving afterwards."""

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.redis]


@pytest.fixture(scope="module")
def cluster(shared_cluster):
    procs = shared_cluster["procs"]
    return {
        "reward": procs["reward"],
        "rollout": procs["rollout0"],
        "learner": procs["learner"],
    }, shared_cluster["model"]


class ReflectedClient:
    """Builds request/response classes from server reflection, as a non-Python client would."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        self.pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(self.channel))

    def services(self) -> list[str]:
        return ProtoReflectionDescriptorDatabase(self.channel).get_services()

    def call(self, service: str, method: str, fields: dict, timeout: float = 120):
        m = self.pool.FindServiceByName(service).FindMethodByName(method)
        request_cls = message_factory.GetMessageClass(m.input_type)
        response_cls = message_factory.GetMessageClass(m.output_type)
        rpc = self.channel.unary_unary(
            f"/{service}/{method}",
            request_serializer=request_cls.SerializeToString,
            response_deserializer=response_cls.FromString,
        )
        request = request_cls()
        _fill(request, fields)
        return rpc(request, timeout=timeout)


def _fill(msg, fields: dict):
    for key, value in fields.items():
        if isinstance(value, dict):
            _fill(getattr(msg, key), value)
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            for item in value:
                _fill(getattr(msg, key).add(), item)
        elif isinstance(value, list):
            getattr(msg, key).extend(value)
        else:
            setattr(msg, key, value)


def test_generate_and_score_batch_through_reflection_only(cluster):
    procs, _ = cluster
    rollout = ReflectedClient(procs["rollout"].address)
    assert "brorl.v1.RolloutService" in rollout.services()
    resp = rollout.call(
        "brorl.v1.RolloutService",
        "Generate",
        {"prompt": "12+34=", "sampling": {"n": 512, "temperature": 1.0, "max_tokens": 6}},
    )
    assert len(resp.paths) == 512
    assert all(len(p.token_ids) == len(p.logprobs) > 0 for p in resp.paths)
    assert {p.finish_reason for p in resp.paths} <= {"stop", "length"}
    assert len({p.path_id for p in resp.paths}) == 512

    reward = ReflectedClient(procs["reward"].address)
    items = [{"id": p.path_id, "completion": p.text, "reference": "46"} for p in resp.paths]
    items[0]["completion"] = "46"
    scored = reward.call(
        "brorl.v1.RewardService", "ScoreBatch", {"reward_fn": "math_answer", "items": items}
    )
    assert len(scored.results) == 512
    assert scored.results[0].reward == 1.0 and scored.results[0].id == items[0]["id"]
    assert all(r.status for r in scored.results)


BAD_GENERATE = [
    ({"prompt": "1+1=", "sampling": {"n": 0}}, "sampling.n"),
    ({"prompt": "1+1=", "sampling": {"n": 5000}}, "sampling.n"),
    ({"prompt": "", "sampling": {"n": 4}}, "prompt"),
    ({"prompt": "1+1=", "sampling": {"n": 4, "temperature": -0.5}}, "sampling.temperature"),
    ({"prompt": "1+1=", "sampling": {"n": 4, "temperature": 0.0}}, "sampling.temperature"),
    ({"prompt": "1+1=" * 40, "sampling": {"n": 4, "temperature": 1.0}}, "sampling"),
]


@pytest.mark.parametrize("fields,field", BAD_GENERATE)
def test_bad_generate_requests_are_invalid_argument(cluster, fields, field):
    procs, _ = cluster
    client = ReflectedClient(procs["rollout"].address)
    with pytest.raises(grpc.RpcError) as err:
        client.call("brorl.v1.RolloutService", "Generate", fields)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()
    ok = client.call(
        "brorl.v1.RolloutService",
        "Generate",
        {"prompt": "1+1=", "sampling": {"n": 2, "temperature": 1.0, "max_tokens": 3}},
    )
    assert len(ok.paths) == 2


def test_unknown_reward_function_is_invalid_argument(cluster):
    procs, _ = cluster
    client = ReflectedClient(procs["reward"].address)
    with pytest.raises(grpc.RpcError) as err:
        client.call(
            "brorl.v1.RewardService",
            "ScoreBatch",
            {"reward_fn": "nope", "items": [{"completion": "1"}]},
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "reward_fn" in err.value.details() and "math_answer" in err.value.details()
    ok = client.call(
        "brorl.v1.RewardService",
        "ScoreBatch",
        {"reward_fn": "math_answer", "items": [{"completion": "7", "reference": "7"}]},
    )
    assert ok.results[0].reward == 1.0


@pytest.mark.parametrize(
    "config_yaml,field",
    [
        ("model: [unclosed", "config_yaml"),
        ("model: MODEL-nonexistent\ndata: {train_path: MODEL/x.jsonl}", "model"),
        ("model: MODEL\ndata: {train_path: x.jsonl}\nsampling: {n: -3}", "sampling.n"),
        ("model: MODEL\ndata: {train_path: x.jsonl}\ntrian: {steps: 3}", "trian"),
        ("model: MODEL\ndata: {train_path: MODEL/../nonexistent.jsonl}", "data.train_path"),
    ],
)
def test_malformed_run_config_is_invalid_argument(cluster, config_yaml, field):
    procs, model = cluster
    client = ReflectedClient(procs["learner"].address)
    with pytest.raises(grpc.RpcError) as err:
        client.call(
            "brorl.v1.LearnerService",
            "StartRun",
            {"config_yaml": config_yaml.replace("MODEL", model)},
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(field), err.value.details()
    with pytest.raises(grpc.RpcError) as missing:
        client.call("brorl.v1.LearnerService", "GetRun", {"run_id": "nope"})
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND  # still serving


@pytest.mark.parametrize(
    "config_yaml,field",
    [
        ("model: /etc\ndata: {train_path: x.jsonl}", "model"),
        ("model: MODEL\ndata: {train_path: /etc/passwd}", "data.train_path"),
    ],
)
def test_paths_outside_the_read_roots_are_permission_denied(cluster, config_yaml, field):
    procs, model = cluster
    client = ReflectedClient(procs["learner"].address)
    with pytest.raises(grpc.RpcError) as err:
        client.call(
            "brorl.v1.LearnerService",
            "StartRun",
            {"config_yaml": config_yaml.replace("MODEL", model)},
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert err.value.details().startswith(field) and "read_roots" in err.value.details()
