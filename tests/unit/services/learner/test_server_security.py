"""LearnerService behind the token and TLS (brorl.security), served in this process over a real
TLS port: every RPC refuses a call without the right token with UNAUTHENTICATED and answers the
same call with it; refused calls leave health, reflection and the service working; a client
without the cluster's CA never reaches it."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from brorl import rpc
from brorl.client import LearnerClient
from brorl.config.base import validate
from brorl.security import SecurityConfig
from brorl.v1 import learner_pb2, learner_pb2_grpc
from services.learner.config import LearnerServiceConfig
from services.learner.observe.runstate import RunState
from services.learner.server import SERVICE_NAME, LearnerServicer
from tests.certs import make_tls_files

# One call per LearnerService RPC, and the status it gets from a caller with the token: an ended
# run "r1" is in the learner, so all but StartRun (an unparsable config here) succeed.
CALLS = {
    "StartRun": (
        lambda s: s.StartRun(learner_pb2.StartRunRequest(config_yaml="model: [x"), timeout=10),
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "GetRun": (
        lambda s: s.GetRun(learner_pb2.GetRunRequest(run_id="r1"), timeout=10),
        grpc.StatusCode.OK,
    ),
    "WatchRun": (
        lambda s: list(s.WatchRun(learner_pb2.WatchRunRequest(run_id="r1"), timeout=10)),
        grpc.StatusCode.OK,
    ),
    "StopRun": (
        lambda s: s.StopRun(learner_pb2.StopRunRequest(run_id="r1"), timeout=10),
        grpc.StatusCode.OK,
    ),
    "Checkpoint": (
        lambda s: s.Checkpoint(learner_pb2.CheckpointRequest(run_id="r1"), timeout=10),
        grpc.StatusCode.OK,
    ),
}


def status_of(call, stub) -> grpc.StatusCode:
    try:
        call(stub)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.fixture
def learner(tmp_path):
    tls = make_tls_files(tmp_path / "tls")
    security = {
        "token_file": str(tls.token),
        "tls": {"cert": str(tls.cert), "key": str(tls.key), "ca": str(tls.ca)},
    }
    cfg = validate(
        LearnerServiceConfig,
        {"bind": "127.0.0.1:0", "runs_dir": str(tmp_path / "runs"), "security": security},
    )
    servicer = LearnerServicer(cfg, redis_client=None)
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    state = RunState("r1", run_dir, total_steps=1)
    state.step = 1
    state.emit({"learner/loss": 0.25})
    state.last_checkpoint = (str(run_dir / "checkpoints" / "step-1"), 1)
    state.finish("finished")
    servicer.runs["r1"] = state
    server = rpc.Server(cfg.bind, [SERVICE_NAME], security=cfg.security)
    learner_pb2_grpc.add_LearnerServiceServicer_to_server(servicer, server.grpc)
    server.start().set_serving(True)
    client_tls = {"tls": {"ca": str(tls.ca)}}
    clients = {
        "with_token": validate(SecurityConfig, {"token_file": str(tls.token), **client_tls}),
        "no_token": validate(SecurityConfig, client_tls),
    }
    wrong = tmp_path / "wrong-token"
    wrong.write_text("0123456789abcdef" * 4)
    clients["wrong_token"] = validate(SecurityConfig, {"token_file": str(wrong), **client_tls})
    try:
        yield {"address": f"127.0.0.1:{server.port}", "clients": clients, "tls": tls}
    finally:
        server.stop(0)


def stub(learner, who: str):
    return learner_pb2_grpc.LearnerServiceStub(
        rpc.channel(learner["address"], learner["clients"][who])
    )


def test_the_table_covers_every_learner_rpc():
    methods = learner_pb2.DESCRIPTOR.services_by_name["LearnerService"].methods_by_name
    assert set(CALLS) == set(methods)


@pytest.mark.parametrize("method", sorted(CALLS))
def test_without_the_right_token_every_rpc_is_unauthenticated(learner, method):
    call, with_token = CALLS[method]
    for who in ("no_token", "wrong_token"):
        assert status_of(call, stub(learner, who)) == grpc.StatusCode.UNAUTHENTICATED, who
    assert status_of(call, stub(learner, "with_token")) == with_token


def test_refusals_say_why_and_the_service_keeps_serving(learner):
    get = learner_pb2.GetRunRequest(run_id="r1")
    bare = learner_pb2_grpc.LearnerServiceStub(
        rpc.channel(learner["address"], SecurityConfig(tls={"ca": str(learner["tls"].ca)}))
    )
    answers = {}
    for name, metadata in {
        "missing": (),
        "not bearer": (("authorization", "Basic dXNlcjpwYXNz"),),
        "wrong": (("authorization", "Bearer " + "f" * 64),),
    }.items():
        with pytest.raises(grpc.RpcError) as err:
            bare.GetRun(get, metadata=metadata, timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        answers[name] = err.value.details()
    assert "Bearer <token>" in answers["missing"] and "Bearer" in answers["not bearer"]
    assert answers["wrong"] == "invalid token"  # nothing about how close the guess was

    # Health and reflection answer without a token; the service still answers with one.
    channel = rpc.channel(learner["address"], learner["clients"]["no_token"])
    health = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=10
    )
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert SERVICE_NAME in ProtoReflectionDescriptorDatabase(channel).get_services()
    assert stub(learner, "with_token").GetRun(get, timeout=10).state == "finished"
    assert (
        status_of(
            lambda s: s.StopRun(learner_pb2.StopRunRequest(run_id="nope"), timeout=10),
            stub(learner, "with_token"),
        )
        == grpc.StatusCode.NOT_FOUND
    )


def test_tls_only_and_the_client_verifies_the_server(learner, tmp_path):
    address = learner["address"]
    token = {"token_file": str(learner["tls"].token)}
    client = LearnerClient(
        address,
        security=validate(SecurityConfig, {**token, **{"tls": {"ca": str(learner["tls"].ca)}}}),
    )
    assert client.get("r1").step == 1
    client.close()
    rpc.wait_serving(address, timeout=10, security=learner["clients"]["no_token"])

    plaintext = LearnerClient(address, security=validate(SecurityConfig, token))
    other_ca = make_tls_files(tmp_path / "other", ca_name="someone else's CA")
    impostor = LearnerClient(
        address,
        security=validate(SecurityConfig, {**token, "tls": {"ca": str(other_ca.ca)}}),
        deadline_s=5,
    )
    for c in (plaintext, impostor):
        with pytest.raises(grpc.RpcError) as err:
            c.stub.GetRun(learner_pb2.GetRunRequest(run_id="r1"), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        c.close()
