"""Domain errors and the one place that maps them to gRPC status codes.

Handlers raise these; the error interceptor turns them into a status with the
reason in the message and in trailing metadata (``niuniu-reason``), so a
frontend can branch on a stable reason code and a person can read the message.
Anything else that escapes a handler is a bug: it becomes INTERNAL, never
UNKNOWN, and is logged with its traceback.
"""

from __future__ import annotations

import grpc


class DomainError(Exception):
    """Base of every error a client may see. ``reason`` is a stable UPPER_SNAKE code."""

    code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class InvalidArgument(DomainError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(DomainError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(DomainError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(DomainError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class PermissionDenied(DomainError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(DomainError):
    code = grpc.StatusCode.UNAUTHENTICATED


class Aborted(DomainError):
    """A concurrent change won; the client may retry with the same command id."""

    code = grpc.StatusCode.ABORTED


class ResourceExhausted(DomainError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(DomainError):
    code = grpc.StatusCode.UNAVAILABLE


REASON_METADATA_KEY = "niuniu-reason"
