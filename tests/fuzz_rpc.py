"""Shared pieces of the RPC fuzz tests (tests/unit/services/*/test_fuzz_*.py): hypothesis
strategies for random and boundary-valued fields, the settings every fuzz test runs under, and
the checks that an answer is a documented status and that the service stays healthy."""

from __future__ import annotations

import collections

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# >= 500 generated requests per RPC (issue #10); no example database: nothing written to disk.
FUZZ = settings(
    max_examples=500,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MIN_CALLS = 500

INT32 = (-(2**31), -1, 0, 1, 2, 2**31 - 1)
INT64 = (-(2**63), -(2**31), -1, 0, 1, 2**31, 2**63 - 1)
FLOAT32_EDGES = (0.0, -0.0, 1.0, -1.0, 1e-45, 3.4e38, -3.4e38, float("inf"), float("-inf"))
NAN = float("nan")
BOUNDARY_TEXT = (
    "",
    " ",
    "\n\t ",
    "\x00",
    "0",
    "-1",
    "nan",
    "inf",
    "1e308",
    "\\boxed{",
    "\\boxed{}" * 50,
    "9" * 5000,
    "x" * 100_000,
    "é漢字🙂",
    "\u202e\u200b",
    "../../etc/passwd",
    "composite:",
    "composite:=1",
    "composite:math_answer=nan",
    "composite:math_answer=inf,format=-inf",
    "composite:" + ",".join(f"f{i}=1" for i in range(300)),
)


def text(max_size: int = 200):
    """Any valid UTF-8 text (protobuf strings cannot hold lone surrogates) or a boundary value."""
    return st.one_of(
        st.text(st.characters(blacklist_categories=("Cs",)), max_size=max_size),
        st.sampled_from(BOUNDARY_TEXT),
    )


def int32(lo: int = -(2**31), hi: int = 2**31 - 1, edges=()):
    return st.one_of(st.sampled_from(INT32 + tuple(edges)), st.integers(lo, hi))


def int64():
    return st.one_of(st.sampled_from(INT64), st.integers(-(2**63), 2**63 - 1))


def float32(edges=()):
    """What a proto `float` field can carry: any float32, NaN and infinities included."""
    return st.one_of(
        st.sampled_from(FLOAT32_EDGES + (NAN,) + tuple(edges)),
        st.floats(width=32, allow_nan=True, allow_infinity=True),
    )


def unknown_fields():
    """Serialized protobuf made only of fields the message does not define (kept as unknown
    fields): the one way to vary a request message that has no fields."""
    field = st.tuples(st.integers(1, 2**29 - 1), st.integers(0, 2**64 - 1))
    return st.lists(field, max_size=8).map(
        lambda fields: b"".join(_varint(n << 3) + _varint(v) for n, v in fields)
    )


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


class Tally:
    """Status codes seen per RPC; ``check`` fails on any code outside the allowed table."""

    def __init__(self, allowed: dict[str, set[grpc.StatusCode]]):
        self.allowed = allowed
        self.seen: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def call(self, method: str, fn) -> grpc.StatusCode:
        try:
            fn()
            code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            code = exc.code()
            detail = exc.details()
        else:
            detail = ""
        self.seen[method][code.name] += 1
        assert code in self.allowed[method], f"{method} answered {code.name}: {detail}"
        return code

    def assert_enough(self, method: str) -> None:
        assert sum(self.seen[method].values()) >= MIN_CALLS, dict(self.seen[method])


def raw_unary(channel: grpc.Channel, path: str):
    """A unary call that sends pre-serialized request bytes."""
    return channel.unary_unary(path, request_serializer=lambda b: b)


def assert_serving(channel: grpc.Channel, service: str) -> None:
    for name in ("", service):
        status = (
            health_pb2_grpc.HealthStub(channel)
            .Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
            .status
        )
        assert status == health_pb2.HealthCheckResponse.SERVING, name
