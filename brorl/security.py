"""Who may call a brorl service and how a caller proves it (docs/security.md):

* a shared bearer token, sent as gRPC metadata ``authorization: Bearer <token>`` and checked by
  one server interceptor (``TokenCheck``) in front of every RPC except Health and reflection;
* TLS: a server with ``tls.cert`` + ``tls.key`` listens with TLS only; a process with ``tls.ca``
  calls other services over TLS and verifies them against that CA.

Every service config has a ``security`` section (``SecurityConfig``, or ``InferenceSecurityConfig``
for rollout and reward); clients (``brorl.client``, ``brorl`` CLI, launcher) use the same model.
``brorl.rpc`` applies it: ``Server`` (credentials + interceptor) and ``channel``.
"""

from __future__ import annotations

import collections
import hmac
import logging
import os
import string
from pathlib import Path

import grpc
from pydantic import Field, PrivateAttr, model_validator

from brorl.config.base import StrictModel
from brorl.errors import Unauthenticated

log = logging.getLogger(__name__)

# Answer without a token: a launcher, compose and load balancers probe health, and a client in any
# language discovers the contract by reflection before it can call anything.
OPEN_SERVICES = frozenset(
    {
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    }
)
MIN_TOKEN_CHARS = 16
_TOKEN_CHARS = frozenset(string.ascii_letters + string.digits + string.punctuation)
METADATA_KEY = "authorization"


class TlsConfig(StrictModel):
    cert: str = Field(
        "",
        description="PEM certificate (chain) this service presents; with `key` set, the server "
        "accepts TLS connections only. It must name every address clients use (DNS or IP SAN).",
    )
    key: str = Field("", description="PEM private key of `cert`.")
    ca: str = Field(
        "",
        description="PEM CA certificate(s) that signed the servers this process calls; set: its "
        "calls (e.g. rollout -> reward, CLI -> learner) use TLS and verify the server against it.",
    )

    @model_validator(mode="after")
    def _files(self):
        if bool(self.cert) != bool(self.key):
            raise ValueError("tls.cert and tls.key go together: set both or neither")
        for name in ("cert", "key", "ca"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ValueError(f"tls.{name}: file {path} does not exist")
        return self

    def server_credentials(self) -> grpc.ServerCredentials | None:
        if not self.cert:
            return None
        return grpc.ssl_server_credentials(
            [(Path(self.key).read_bytes(), Path(self.cert).read_bytes())]
        )

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        if not self.ca:
            return None
        return grpc.ssl_channel_credentials(root_certificates=Path(self.ca).read_bytes())


class SecurityConfig(StrictModel):
    """The learner's settings, and a client's: a token on every RPC but Health and reflection."""

    token_env: str = Field(
        "",
        description="Environment variable holding the shared token (never the token itself). "
        "Set here or in token_file: this service's RPCs need it and its calls send it. Neither: "
        "no token (anyone who reaches the port may call).",
    )
    token_file: str = Field(
        "",
        description="File whose content (surrounding whitespace stripped) is the shared token; "
        "keep it readable by the service's user only.",
    )
    tls: TlsConfig = Field(
        default_factory=TlsConfig, description="TLS of this server and of the calls it makes."
    )
    _token: str = PrivateAttr("")

    @model_validator(mode="after")
    def _load_token(self):
        # Read once here: a missing variable or file is a config error at start (fail closed),
        # never a service that silently runs open.
        if self.token_env and self.token_file:
            raise ValueError("set token_env or token_file, not both")
        if self.token_env:
            token = os.environ.get(self.token_env, "").strip()
            where = f"token_env: environment variable {self.token_env}"
            if not token:
                raise ValueError(f"{where} is not set or empty")
        elif self.token_file:
            where = f"token_file {self.token_file}"
            try:
                token = Path(self.token_file).read_text().strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"{where} cannot be read ({exc})") from None
        else:
            token = ""
        if token and (len(token) < MIN_TOKEN_CHARS or not set(token) <= _TOKEN_CHARS):
            raise ValueError(
                f"{where}: the token must be at least {MIN_TOKEN_CHARS} printable ASCII "
                "characters without spaces (e.g. `openssl rand -hex 32`)"
            )
        self._token = token
        return self

    @property
    def token(self) -> str:
        """The token this process sends on its calls ("": none)."""
        return self._token

    def required_token(self) -> str:
        """The token this process's own RPCs require ("": every RPC is open)."""
        return self._token


class InferenceSecurityConfig(SecurityConfig):
    """Rollout and reward: their RPCs may be left open while their own calls carry the token."""

    token_for_inference: bool = Field(
        True,
        description="With a token set, this service's RPCs (rollout: Generate, GenerateStream, "
        "GetStatus; reward: Score, ScoreBatch, ListRewardFunctions) need it; false serves them "
        "to anyone who reaches the port (calls this service makes still send the token).",
    )

    def required_token(self) -> str:
        return self._token if self.token_for_inference else ""


def _service_of(method: str) -> str:
    """``/pkg.Service/Method`` → ``pkg.Service``."""
    return method.lstrip("/").split("/", 1)[0]


class TokenCheck(grpc.ServerInterceptor):
    """Every RPC outside ``OPEN_SERVICES`` must carry ``authorization: Bearer <token>``; anything
    else is answered UNAUTHENTICATED before the servicer runs (the server keeps serving)."""

    def __init__(self, token: str):
        self._expected = token.encode()

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or _service_of(handler_call_details.method) in OPEN_SERVICES:
            return handler
        problem = self._problem(handler_call_details.invocation_metadata or ())
        if problem is None:
            return handler
        return _refusal(handler, handler_call_details.method, problem)

    def _problem(self, metadata) -> str | None:
        values = [v for k, v in metadata if k == METADATA_KEY]
        if not values:
            return (
                f"missing credentials: send metadata '{METADATA_KEY}: Bearer <token>' "
                "(docs/security.md)"
            )
        scheme, _, presented = str(values[0]).partition(" ")
        if scheme.lower() != "bearer" or not presented:
            return f"{METADATA_KEY} metadata must be 'Bearer <token>'"
        # Constant time: how much of a guess matched must not show in the answer's latency.
        if not hmac.compare_digest(presented.strip().encode(), self._expected):
            return "invalid token"
        return None


def _refusal(handler, method: str, problem: str):
    """A handler of the same shape as ``handler`` that only answers UNAUTHENTICATED."""

    def refuse(_request, context):
        log.warning("refused %s from %s: %s", method, context.peer(), problem)
        error = Unauthenticated(problem)
        context.abort(error.code, str(error))

    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return make(
        refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class _CallDetails(
    collections.namedtuple(
        "_CallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    pass


class BearerToken(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Client side: adds ``authorization: Bearer <token>`` to every call of a channel. (gRPC's
    call credentials would refuse a plaintext channel; a token on loopback without TLS is a
    supported setup.)"""

    def __init__(self, token: str):
        self._pair = (METADATA_KEY, f"Bearer {token}")

    def _details(self, d) -> _CallDetails:
        return _CallDetails(
            d.method,
            d.timeout,
            [*(d.metadata or ()), self._pair],
            d.credentials,
            d.wait_for_ready,
            d.compression,
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)
