"""A learner process with a token and TLS (docs/security.md), configured the way the launcher
configures it (ServiceProc: `security.*` overrides): health answers over TLS without the token,
a caller without the token gets UNAUTHENTICATED, one without the CA does not get in at all, and
the service keeps serving. (The unit tests cover every RPC in process.)"""

import grpc
import pytest

from brorl.apps.cluster.service_proc import ServiceProc
from brorl.client import LearnerClient
from brorl.config.base import validate
from brorl.security import SecurityConfig
from tests.certs import make_tls_files

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.redis]


def settings(files, **keys) -> SecurityConfig:
    """A client's (or with tls cert/key, the cluster's) settings: TLS with the test CA."""
    return validate(SecurityConfig, keys | {"tls": {"ca": str(files.ca), **keys.get("tls", {})}})


def code_of(call) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_learner_process_with_tls_and_token(tmp_path):
    tls = make_tls_files(tmp_path / "tls")
    server = settings(
        tls, token_file=str(tls.token), tls={"cert": str(tls.cert), "key": str(tls.key)}
    )
    proc = ServiceProc("learner", tmp_path, security=server, runs_dir=str(tmp_path / "runs"))
    try:
        proc.wait_serving(timeout=120)  # health over TLS, without the token
        with_token = LearnerClient(proc.address, security=settings(tls, token_file=str(tls.token)))
        no_token = LearnerClient(proc.address, security=settings(tls))
        plaintext = LearnerClient(proc.address)
        assert code_of(lambda: with_token.get("nope")) == grpc.StatusCode.NOT_FOUND
        assert code_of(lambda: no_token.get("nope")) == grpc.StatusCode.UNAUTHENTICATED
        assert code_of(lambda: plaintext.get("nope")) == grpc.StatusCode.UNAVAILABLE
        assert code_of(lambda: with_token.get("nope")) == grpc.StatusCode.NOT_FOUND  # serving
    finally:
        proc.stop()
