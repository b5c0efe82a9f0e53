"""Domain errors that carry a gRPC status; servers translate them in one place (brorl.rpc)."""

from __future__ import annotations

import grpc


class BrorlError(Exception):
    """Base class: an error a caller can act on. ``code`` is the gRPC status to return."""

    code = grpc.StatusCode.INTERNAL


class InvalidArgument(BrorlError):
    """The request is wrong; the message names the field and what to change."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


class FailedPrecondition(BrorlError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(BrorlError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(BrorlError):
    code = grpc.StatusCode.UNAVAILABLE


class NotFound(BrorlError):
    code = grpc.StatusCode.NOT_FOUND


class Unauthenticated(BrorlError):
    """The call carries no valid credentials (brorl.security)."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(BrorlError):
    """The caller may not make the service do this; the message names the field and the rule."""

    code = grpc.StatusCode.PERMISSION_DENIED

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")
