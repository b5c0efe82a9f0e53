"""The reward service's token (brorl.security, InferenceSecurityConfig) over plaintext loopback:
with a token its RPCs need it unless token_for_inference is false; health answers either way,
and the channel the rollout worker uses (rpc.channel with the service's security) sends it."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from brorl import rpc
from brorl.config.base import validate
from brorl.security import SecurityConfig
from brorl.v1 import reward_pb2, reward_pb2_grpc
from services.reward.config import RewardServiceConfig
from services.reward.server import build_server

TOKEN = "reward-token-" + "7" * 20
ONE = reward_pb2.ScoreRequest(reward_fn="exact_match", completion="7", reference="7")
BATCH = reward_pb2.ScoreBatchRequest(reward_fn="exact_match", items=[ONE])


@pytest.fixture
def reward(monkeypatch):
    monkeypatch.setenv("REWARD_TEST_TOKEN", TOKEN)
    servers = []

    def start(**security) -> str:
        cfg = validate(
            RewardServiceConfig,
            {"bind": "127.0.0.1:0", "security": {"token_env": "REWARD_TEST_TOKEN", **security}},
        )
        server = build_server(cfg).start()
        server.set_serving(True)
        servers.append(server)
        return f"127.0.0.1:{server.port}"

    yield start
    for server in servers:
        server.stop(0)


def calls(address: str, security: SecurityConfig | None) -> dict[str, grpc.StatusCode]:
    stub = reward_pb2_grpc.RewardServiceStub(rpc.channel(address, security))
    out = {}
    for name, call in {
        "Score": lambda: stub.Score(ONE, timeout=10),
        "ScoreBatch": lambda: stub.ScoreBatch(BATCH, timeout=10),
        "ListRewardFunctions": lambda: stub.ListRewardFunctions(
            reward_pb2.ListRewardFunctionsRequest(), timeout=10
        ),
    }.items():
        try:
            call()
            out[name] = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            out[name] = exc.code()
    return out


def test_reward_rpcs_need_the_token_by_default(reward):
    address = reward()
    assert set(calls(address, None).values()) == {grpc.StatusCode.UNAUTHENTICATED}
    as_worker = validate(SecurityConfig, {"token_env": "REWARD_TEST_TOKEN"})
    assert set(calls(address, as_worker).values()) == {grpc.StatusCode.OK}
    health = health_pb2_grpc.HealthStub(rpc.channel(address)).Check(
        health_pb2.HealthCheckRequest(), timeout=10
    )
    assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_token_for_inference_false_leaves_them_open(reward):
    address = reward(token_for_inference=False)
    assert set(calls(address, None).values()) == {grpc.StatusCode.OK}
