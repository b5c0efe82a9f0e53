"""Container health check: exit 0 when the gRPC health service at ADDRESS answers SERVING.

    python /app/docker/healthcheck.py HOST:PORT [SERVICE] [--timeout SECONDS] [--ca FILE]

Exit codes: 0 SERVING, 1 anything else (NOT_SERVING, no answer, deadline), 2 bad usage.
Imports only grpcio and grpcio-health-checking, so a check costs a fraction of a second; the
services start NOT_SERVING and turn SERVING only once they can work (model loaded, ...).
A TLS server is checked over TLS when ``--ca`` (default: $BRORL_SECURITY__TLS__CA, the variable
the services read) names the CA of its certificate; health needs no token (docs/security.md).
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def _channel(address: str, ca: str) -> grpc.Channel:
    if not ca:
        return grpc.insecure_channel(address)
    with open(ca, "rb") as f:
        return grpc.secure_channel(address, grpc.ssl_channel_credentials(f.read()))


def check(address: str, service: str = "", timeout: float = 3.0, ca: str = "") -> tuple[bool, str]:
    """One Health.Check call: (serving?, what was seen)."""
    try:
        channel = _channel(address, ca)
    except OSError as exc:
        return False, f"cannot read the CA certificate: {exc}"
    try:
        with channel:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
    except grpc.RpcError as exc:
        return False, exc.code().name
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    return response.status == health_pb2.HealthCheckResponse.SERVING, status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="healthcheck.py", description=__doc__.splitlines()[0])
    parser.add_argument("address", help="host:port of the gRPC server")
    parser.add_argument(
        "service", nargs="?", default="", help="service name; empty: the whole server"
    )
    parser.add_argument(
        "--timeout", type=float, default=3.0, help="deadline of the call in seconds"
    )
    parser.add_argument(
        "--ca",
        default=os.environ.get("BRORL_SECURITY__TLS__CA", ""),
        help="CA certificate of a TLS server (default: $BRORL_SECURITY__TLS__CA)",
    )
    args = parser.parse_args(argv)
    ok, seen = check(args.address, args.service, args.timeout, args.ca)
    print(
        f"{args.address} {args.service or '(server)'}: {seen}",
        file=sys.stdout if ok else sys.stderr,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
