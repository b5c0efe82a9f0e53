"""brorl.metrics and the RPC interceptor of brorl.rpc.Server: /metrics served over real HTTP,
values read at scrape time, and every RPC's latency and status code counted on a real gRPC
server (OK, a domain error, a crash, a stream, a call the token check refuses), and
serve_until_stopped writing the metrics port next to the gRPC port file."""

from __future__ import annotations

import threading
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from brorl import rpc
from brorl.errors import InvalidArgument
from brorl.metrics import Metrics, Sample, parse_bind
from brorl.security import SecurityConfig

TOKEN = "metrics-test-token-" + "4" * 20


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        return resp.read().decode()


def test_served_over_http_with_values_read_at_scrape_time():
    metrics = Metrics()
    metrics.counter("thing_done_total", "things", ("kind",)).labels("a").inc(3)
    box = {"depth": 5}
    metrics.read_at_scrape(lambda: [Sample("queue_depth", "depth", box["depth"], {"q": "x"})])
    metrics.read_at_scrape(lambda: 1 / 0)  # a broken source leaves only its own series out
    port = metrics.serve("127.0.0.1:0")
    try:
        assert port > 0
        text = scrape(port)
        assert 'brorl_thing_done_total{kind="a"} 3.0' in text
        assert 'brorl_queue_depth{q="x"} 5.0' in text
        box["depth"] = 7  # read again at the next scrape, not cached
        assert 'brorl_queue_depth{q="x"} 7.0' in scrape(port)
    finally:
        metrics.close()
    with pytest.raises(OSError):
        scrape(port)


def test_counter_samples_and_the_same_series_object():
    metrics = Metrics()
    metrics.read_at_scrape(lambda: [Sample("paths_total", "p", 4, {"w": "1"}, kind="counter")])
    assert 'brorl_paths_total{w="1"} 4.0' in metrics.exposition()
    assert metrics.gauge("g", "doc") is metrics.gauge("g", "doc")
    with pytest.raises(TypeError):
        metrics.counter("g", "doc")


@pytest.mark.parametrize("bind", ["9400", ":9400", "host:", "host:port"])
def test_bad_bind_is_refused(bind):
    with pytest.raises(ValueError, match="host:port"):
        parse_bind(bind)


def test_parse_bind():
    assert parse_bind("0.0.0.0:9452") == ("0.0.0.0", 9452)
    assert parse_bind("[::1]:0") == ("::1", 0)


def _echo_handlers():
    def ok(request, context):
        return request

    def bad(request, context):
        raise InvalidArgument("field", "is wrong")

    def crash(request, context):
        raise RuntimeError("boom")

    def stream(request, context):
        yield from (request, request)

    ident = {"request_deserializer": bytes, "response_serializer": bytes}

    @rpc.translate_errors
    def translated_bad(self, request, context):  # the way every servicer method raises
        return bad(request, context)

    return grpc.method_handlers_generic_handler(
        "test.Echo",
        {
            "Ok": grpc.unary_unary_rpc_method_handler(ok, **ident),
            "Bad": grpc.unary_unary_rpc_method_handler(
                lambda r, c: translated_bad(None, r, c), **ident
            ),
            "Crash": grpc.unary_unary_rpc_method_handler(crash, **ident),
            "Stream": grpc.unary_stream_rpc_method_handler(stream, **ident),
        },
    )


def _server(metrics: Metrics, security: SecurityConfig | None = None) -> rpc.Server:
    server = rpc.Server("127.0.0.1:0", ["test.Echo"], security=security, metrics=metrics)
    server.grpc.add_generic_rpc_handlers((_echo_handlers(),))
    return server.start()


def _call(channel, method: str, stream: bool = False):
    path = f"/test.Echo/{method}"
    make = channel.unary_stream if stream else channel.unary_unary
    call = make(path, request_serializer=bytes, response_deserializer=bytes)
    try:
        result = call(b"x", timeout=10)
        return list(result) if stream else result
    except grpc.RpcError as exc:
        return exc.code()


def count(metrics: Metrics, method: str, code: str, service: str = "test.Echo") -> float:
    value = metrics.registry.get_sample_value(
        "brorl_rpc_requests_total", {"service": service, "method": method, "code": code}
    )
    return value or 0.0


def latency_count(metrics: Metrics, method: str, service: str = "test.Echo") -> float:
    value = metrics.registry.get_sample_value(
        "brorl_rpc_latency_seconds_count", {"service": service, "method": method}
    )
    return value or 0.0


def test_every_rpc_is_timed_and_counted_by_status_code():
    metrics = Metrics()
    server = _server(metrics)
    try:
        with rpc.channel(f"127.0.0.1:{server.port}") as ch:
            assert _call(ch, "Ok") == b"x"
            assert _call(ch, "Ok") == b"x"
            assert _call(ch, "Bad") == grpc.StatusCode.INVALID_ARGUMENT
            assert _call(ch, "Crash") == grpc.StatusCode.UNKNOWN
            assert _call(ch, "Stream", stream=True) == [b"x", b"x"]
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert _call(ch, "Missing") == grpc.StatusCode.UNIMPLEMENTED
    finally:
        server.stop(0)
    assert count(metrics, "Ok", "OK") == 2
    assert count(metrics, "Bad", "INVALID_ARGUMENT") == 1 and count(metrics, "Bad", "OK") == 0
    assert count(metrics, "Crash", "UNKNOWN") == 1
    assert count(metrics, "Stream", "OK") == 1
    assert count(metrics, "Check", "OK", service="grpc.health.v1.Health") == 1
    assert count(metrics, "Missing", "UNIMPLEMENTED") == 0  # no handler: nothing to label
    assert [latency_count(metrics, m) for m in ("Ok", "Bad", "Crash", "Stream")] == [2, 1, 1, 1]
    in_flight = metrics.registry.get_sample_value(
        "brorl_rpc_in_flight", {"service": "test.Echo", "method": "Ok"}
    )
    assert in_flight == 0


def test_stream_latency_lasts_until_its_last_message():
    metrics = Metrics()
    server = _server(metrics)
    pause = threading.Event()

    def slow(request, context):
        yield request
        pause.wait(5)
        yield request

    server.grpc.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Slow",
                {
                    "S": grpc.unary_stream_rpc_method_handler(
                        slow, request_deserializer=bytes, response_serializer=bytes
                    )
                },
            ),
        )
    )
    try:
        with rpc.channel(f"127.0.0.1:{server.port}") as ch:
            call = ch.unary_stream("/test.Slow/S", request_serializer=bytes)(b"x", timeout=10)
            next(call)
            time.sleep(0.3)
            pause.set()
            list(call)
    finally:
        server.stop(0)
    total = metrics.registry.get_sample_value(
        "brorl_rpc_latency_seconds_sum", {"service": "test.Slow", "method": "S"}
    )
    assert total >= 0.3


def test_a_stream_the_client_leaves_is_cancelled_not_an_error():
    metrics = Metrics()
    server = _server(metrics)
    def endless(request, context):
        while True:
            yield request
            time.sleep(0.05)

    server.grpc.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Endless",
                {
                    "S": grpc.unary_stream_rpc_method_handler(
                        endless, request_deserializer=bytes, response_serializer=bytes
                    )
                },
            ),
        )
    )
    try:
        with rpc.channel(f"127.0.0.1:{server.port}") as ch:
            call = ch.unary_stream("/test.Endless/S", request_serializer=bytes)(b"x", timeout=10)
            next(call)
            call.cancel()
            deadline = time.monotonic() + 10
            while count(metrics, "S", "CANCELLED", "test.Endless") == 0:
                assert time.monotonic() < deadline, metrics.exposition()
                time.sleep(0.05)
    finally:
        server.stop(0)
    assert count(metrics, "S", "UNKNOWN", "test.Endless") == 0


def test_calls_the_token_check_refuses_are_counted(monkeypatch):
    monkeypatch.setenv("METRICS_TEST_TOKEN", TOKEN)
    security = SecurityConfig(token_env="METRICS_TEST_TOKEN")
    metrics = Metrics()
    server = _server(metrics, security)
    try:
        with rpc.channel(f"127.0.0.1:{server.port}") as ch:
            assert _call(ch, "Ok") == grpc.StatusCode.UNAUTHENTICATED
        with rpc.channel(f"127.0.0.1:{server.port}", security) as ch:
            assert _call(ch, "Ok") == b"x"
    finally:
        server.stop(0)
    assert count(metrics, "Ok", "UNAUTHENTICATED") == 1
    assert count(metrics, "Ok", "OK") == 1


def test_serve_until_stopped_writes_the_metrics_port_beside_the_port_file(tmp_path):
    metrics = Metrics()
    server = rpc.Server("127.0.0.1:0", ["test.Echo"], metrics=metrics)
    port_file = tmp_path / "svc.port"
    thread = threading.Thread(
        target=rpc.serve_until_stopped,
        args=(server, "test", str(port_file)),
        kwargs={"metrics_bind": "127.0.0.1:0"},
    )
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        metrics_port = int(rpc.metrics_port_file(port_file).read_text())
        assert metrics_port == metrics.port and metrics_port != int(port_file.read_text())
        with rpc.channel(f"127.0.0.1:{port_file.read_text()}") as ch:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
        text = scrape(metrics_port)
        assert 'brorl_rpc_requests_total{code="OK",method="Check"' in text
    finally:
        server.grpc.stop(0)
        thread.join(10)
    with pytest.raises(OSError):  # stopped with the service
        scrape(metrics_port)


def test_no_metrics_bind_serves_nothing(tmp_path):
    server = rpc.Server("127.0.0.1:0", ["test.Echo"], metrics=Metrics())
    port_file = tmp_path / "svc.port"
    thread = threading.Thread(target=rpc.serve_until_stopped, args=(server, "t", str(port_file)))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert port_file.exists() and not rpc.metrics_port_file(port_file).exists()
        assert server.metrics.port == 0
    finally:
        server.grpc.stop(0)
        thread.join(10)
