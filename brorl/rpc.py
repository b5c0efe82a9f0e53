"""gRPC plumbing shared by every service: server construction with health and reflection (and
the token check and TLS of brorl.security, and the RPC metrics of brorl.metrics), one error
translator, and client channels whose calls always carry a deadline."""

from __future__ import annotations

import functools
import inspect
import logging
import time
from concurrent import futures
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from pydantic import Field

from brorl.errors import BrorlError
from brorl.security import BearerToken, SecurityConfig, TokenCheck
from brorl.cluster import address

if TYPE_CHECKING:  # brorl.metrics imports prometheus_client: a client of brorl.rpc needs none
    from brorl.metrics import Metrics

log = logging.getLogger(__name__)

# Large enough for a group of 1024 paths with token ids and logprobs.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
DEFAULT_DEADLINE_S = 30.0


# Status details travel in a trailer, and gRPC drops a call whose trailers exceed 16 KiB (the
# client sees RESOURCE_EXHAUSTED "Stream removed"). Messages quote the request (an unknown name,
# a bad value), so they are cut to a size that always fits (a character is up to 4 UTF-8 bytes,
# each percent-encoded to 3 in the trailer when not ASCII).
MAX_DETAILS_CHARS = 1000


def _details(message: str) -> str:
    if len(message) <= MAX_DETAILS_CHARS:
        return message
    return f"{message[: MAX_DETAILS_CHARS - 40]}... ({len(message)} characters, cut)"


def _abort_for(exc: Exception, context: grpc.ServicerContext, method: str):
    if isinstance(exc, BrorlError):
        context.abort(exc.code, _details(str(exc)))
    log.exception("unexpected error in %s", method)
    context.abort(
        grpc.StatusCode.INTERNAL,
        _details(f"internal error in {method}: {type(exc).__name__}: {exc}"),
    )


def translate_errors(fn: Callable) -> Callable:
    """Decorate a servicer method: domain errors become their status, anything else INTERNAL."""
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def stream_wrapper(self, request, context):
            try:
                yield from fn(self, request, context)
            except Exception as exc:  # noqa: BLE001 - the one translation point
                if isinstance(exc, grpc.RpcError) or context.code() is not None:
                    raise
                _abort_for(exc, context, fn.__name__)

        return stream_wrapper

    @functools.wraps(fn)
    def unary_wrapper(self, request, context):
        try:
            return fn(self, request, context)
        except Exception as exc:  # noqa: BLE001 - the one translation point
            if isinstance(exc, grpc.RpcError):
                raise
            _abort_for(exc, context, fn.__name__)

    return unary_wrapper


class RpcMetrics(grpc.ServerInterceptor):
    """Every RPC of a server, health and reflection included, refused ones too: its latency
    (``brorl_rpc_latency_seconds``, until the last message of a stream), its status code
    (``brorl_rpc_requests_total``) and the calls in flight (``brorl_rpc_in_flight``), labelled
    by gRPC service and method. First in the chain, so it sees what the token check refuses."""

    def __init__(self, metrics: "Metrics"):
        labels = ("service", "method")
        self.latency = metrics.histogram(
            "rpc_latency_seconds", "Seconds from an RPC's start to its answer", labels
        )
        self.requests = metrics.counter(
            "rpc_requests_total", "RPCs answered, by status code", (*labels, "code")
        )
        self.in_flight = metrics.gauge("rpc_in_flight", "RPCs being answered now", labels)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None  # unknown method: gRPC answers UNIMPLEMENTED
        service, _, method = handler_call_details.method.lstrip("/").rpartition("/")
        streaming = (handler.request_streaming, handler.response_streaming)
        behavior = {
            (False, False): handler.unary_unary,
            (False, True): handler.unary_stream,
            (True, False): handler.stream_unary,
            (True, True): handler.stream_stream,
        }[streaming]
        observe = functools.partial(self._observe, service, method)
        if handler.response_streaming:

            def measured(request, context):
                start = self._started(service, method)
                failed = True
                try:
                    yield from behavior(request, context)
                    failed = False
                finally:
                    observe(start, context, failed)

        else:

            def measured(request, context):
                start = self._started(service, method)
                failed = True
                try:
                    response = behavior(request, context)
                    failed = False
                    return response
                finally:
                    observe(start, context, failed)

        return _HANDLER_OF_SHAPE[streaming](
            measured,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _started(self, service: str, method: str) -> float:
        self.in_flight.labels(service, method).inc()
        return time.perf_counter()

    def _observe(self, service: str, method: str, start: float, context, failed: bool) -> None:
        self.in_flight.labels(service, method).dec()
        self.latency.labels(service, method).observe(time.perf_counter() - start)
        code = context.code()  # set by abort / set_code; None: the handler did not set one
        if code is None and failed:
            # a stream the client left (a WatchRun closed) is not a server error
            code = grpc.StatusCode.CANCELLED if not context.is_active() else grpc.StatusCode.UNKNOWN
        code = code or grpc.StatusCode.OK
        self.requests.labels(service, method, code.name).inc()


_HANDLER_OF_SHAPE = {  # (request_streaming, response_streaming) → handler factory
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


# Admission control when a service does not say: RPCs in flight (running or waiting for a
# handler thread; an open stream counts until it ends) before gRPC answers RESOURCE_EXHAUSTED.
DEFAULT_MAX_CONCURRENT_RPCS = 64


class Server:
    """A grpc.Server with health (starts NOT_SERVING) and reflection for ``service_names``;
    ``security`` adds the token check (every RPC but health and reflection) and TLS.

    Admission control: at most ``max_concurrent_rpcs`` RPCs are in flight (health and reflection
    included); gRPC answers any call beyond that with RESOURCE_EXHAUSTED at once, so overload is
    shed instead of queued without bound in the handler pool (docs/reliability.md).

    ``metrics``: the process's brorl.metrics.Metrics; every RPC is measured into it (RpcMetrics)
    and ``serve_until_stopped`` serves it on the service's ``metrics_bind``."""

    def __init__(
        self,
        bind: str,
        service_names: Iterable[str],
        max_workers: int = 16,
        security: SecurityConfig | None = None,
        max_concurrent_rpcs: int = DEFAULT_MAX_CONCURRENT_RPCS,
        metrics: "Metrics | None" = None,
    ):
        if max_concurrent_rpcs < 1:
            raise ValueError(f"max_concurrent_rpcs must be at least 1, got {max_concurrent_rpcs}")
        self.service_names = list(service_names)
        self.max_concurrent_rpcs = max_concurrent_rpcs
        self.metrics = metrics
        token = security.required_token() if security else ""
        interceptors = [RpcMetrics(metrics)] if metrics is not None else []
        self.grpc = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers),
            options=CHANNEL_OPTIONS,
            interceptors=interceptors + ([TokenCheck(token)] if token else []),
            maximum_concurrent_rpcs=max_concurrent_rpcs,
        )
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        reflection.enable_server_reflection(
            self.service_names
            + [health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
            self.grpc,
        )
        credentials = security.tls.server_credentials() if security else None
        if credentials:
            self.port = self.grpc.add_secure_port(bind, credentials)
        else:
            self.port = self.grpc.add_insecure_port(bind)
        if self.port == 0:
            raise OSError(f"cannot bind gRPC server to {bind}")
        if token and not credentials and not _loopback(bind):
            log.warning("%s: token required but no TLS: tokens cross the network in clear", bind)
        self.set_serving(False)

    def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in self.service_names + [""]:
            self.health.set(name, status)

    def start(self) -> "Server":
        self.grpc.start()
        return self

    def stop(self, grace: float = 2.0) -> None:
        self.set_serving(False)
        self.grpc.stop(grace).wait()

    def wait(self) -> None:
        self.grpc.wait_for_termination()


def metrics_bind_field(default_port: int):
    """The ``metrics_bind`` field of a service config (the same rule for all three)."""
    return Field(
        address(default_port),
        pattern=r"^(|.+:[0-9]+)$",
        description=(
            "host:port of the Prometheus /metrics endpoint; port 0 picks a free one (written to "
            "<port_file>.metrics); '' serves none (docs/observability.md)."
        ),
    )


def metrics_port_file(port_file: str | Path) -> Path:
    """Where a service whose gRPC port goes to ``port_file`` writes its metrics port."""
    return Path(f"{port_file}.metrics")


def serve_until_stopped(
    server: Server,
    name: str,
    port_file: str = "",
    prepare: Callable[[], None] = lambda: None,
    cleanup: Callable[[], None] = lambda: None,
    metrics_bind: str = "",
) -> None:
    """The life of every brorl service. Listen with health NOT_SERVING, serve the server's
    metrics on ``metrics_bind`` ("" : not served) and write that port to
    ``metrics_port_file(port_file)``, then the gRPC port to ``port_file`` (so a launcher can poll
    health on it and find both); ``prepare`` (load the engine, the reward models, ...); flip
    health to SERVING; serve until interrupted. On the way out: NOT_SERVING, stop the server and
    the metrics endpoint, then ``cleanup`` (close engines, pools)."""
    server.start()
    try:
        if metrics_bind and server.metrics is not None:
            port = server.metrics.serve(metrics_bind)
            log.info("%s metrics on http://%s/metrics", name, _with_port(metrics_bind, port))
            if port_file:
                metrics_port_file(port_file).write_text(str(port))
        if port_file:
            Path(port_file).write_text(str(server.port))
        prepare()
        server.set_serving(True)
        log.info("%s service serving on port %d", name, server.port)
        server.wait()
    finally:
        server.stop()
        if server.metrics is not None:
            server.metrics.close()
        cleanup()


def _with_port(bind: str, port: int) -> str:
    return f"{bind.rpartition(':')[0]}:{port}"


RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def call_with_retry(
    method: Callable,
    request,
    *,
    timeout: float = DEFAULT_DEADLINE_S,
    attempts: int = 5,
    max_backoff_s: float = 10.0,
    sleep=time.sleep,
):
    """Call a unary stub ``method`` with a deadline; UNAVAILABLE / DEADLINE_EXCEEDED are retried
    with exponential backoff (1, 2, 4 ... s, at most ``max_backoff_s``), anything else raises."""
    for attempt in range(attempts):
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as exc:
            if exc.code() not in RETRYABLE or attempt == attempts - 1:
                raise
            log.warning(
                "%s: %s; retry %d of %d",
                getattr(method, "_method", "call"),
                exc.code().name,
                attempt + 1,
                attempts - 1,
            )
            sleep(min(2**attempt, max_backoff_s))
    raise AssertionError("unreachable")


def _loopback(bind: str) -> bool:
    host = bind.rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def channel(address: str, security: SecurityConfig | None = None) -> grpc.Channel:
    """The one way a brorl process opens a channel: TLS verified against ``security.tls.ca`` when
    that is set, and ``security``'s token on every call when it has one."""
    credentials = security.tls.channel_credentials() if security else None
    if credentials:
        ch = grpc.secure_channel(address, credentials, options=CHANNEL_OPTIONS)
    else:
        ch = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    if security and security.token:
        ch = grpc.intercept_channel(ch, BearerToken(security.token))
    return ch


def wait_serving(
    address: str,
    service: str = "",
    timeout: float = 120.0,
    security: SecurityConfig | None = None,
) -> None:
    """Block until the health service at ``address`` reports SERVING; TimeoutError otherwise.
    ``security``: the TLS settings of a TLS server (health itself needs no token)."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    with channel(address, security) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2.0)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
            except grpc.RpcError as exc:
                last = exc.code().name
            time.sleep(0.25)
    raise TimeoutError(
        f"{address} ({service or 'server'}) not SERVING after {timeout:.0f}s (last: {last})"
    )
