"""Domain errors and the one place that maps them to gRPC status codes.

Handlers raise these; the error interceptor turns them into a status with the
reason in the message and in trailing metadata (``niuniu-reason``), so a
frontend can branch on a stable reason code and a person can read the message.
A dependency that fails under a request (PostgreSQL, Redis or Kafka unreachable, a
statement or lock wait that ran out, a downstream service unavailable) is not a bug:
``dependency_failure`` names it, and the caller gets UNAVAILABLE (ABORTED for a
transaction PostgreSQL rolled back to break a conflict), a retryable status; commands
carry the caller's id, so a retry never applies twice. Anything else that escapes a
handler is a bug: it becomes INTERNAL, never UNKNOWN, and is logged with its traceback.
"""

from __future__ import annotations

import re

import grpc
import kafka.errors
import psycopg
import psycopg.errors
import redis.exceptions

from backbone.eventstore import ConcurrencyError

MAX_ECHO_CHARS = 80
"""At most this much of a caller's value (an id, a key, a text) is echoed into an error."""
MAX_REASON_CHARS = 64
MAX_MESSAGE_CHARS = 400
"""An error's whole message (reason included) is cut to this: a caller's 1 MiB id can never be
sent back (the transport would drop the answer: RESOURCE_EXHAUSTED "Stream removed")."""
ELLIPSIS = "…"


def clip(value: object, limit: int = MAX_ECHO_CHARS) -> str:
    """``value`` as it may be echoed to a caller: its repr, cut to ``limit`` characters with an ellipsis.

    The repr shows control characters (a trailing newline, a NUL) instead of sending them.
    """
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[: max(0, limit - len(ELLIPSIS))] + ELLIPSIS


def bounded(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, with an ellipsis when it was longer."""
    return text if len(text) <= limit else text[: max(0, limit - len(ELLIPSIS))] + ELLIPSIS


_LONG_WORD = re.compile(rf"\S{{{MAX_ECHO_CHARS + 1},}}")


def clip_words(text: str) -> str:
    """``text`` with every run of more than ``MAX_ECHO_CHARS`` non-blank characters cut (with an ellipsis):
    an id or value a handler echoed whole comes back at most that long."""
    return _LONG_WORD.sub(lambda m: bounded(m.group(0), MAX_ECHO_CHARS), text)


class DomainError(Exception):
    """Base of every error a client may see. ``reason`` is a stable UPPER_SNAKE code.

    The message is bounded (``MAX_MESSAGE_CHARS``, no word longer than ``MAX_ECHO_CHARS``)
    whatever a handler put into it; handlers echo callers' values through ``clip``.
    """

    code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION

    def __init__(self, reason: str, message: str) -> None:
        reason = bounded(reason, MAX_REASON_CHARS)
        message = bounded(clip_words(message), MAX_MESSAGE_CHARS - len(reason) - 2)
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


MAX_CAUSE_DEPTH = 8
"""How far down an exception's cause/context chain ``dependency_failure`` looks."""


def dependency_failure(error: BaseException) -> DomainError | None:
    """The retryable status for a failed dependency behind ``error`` (or its causes); None if it is none.

    The message names the dependency and the kind of failure, never the driver's text
    (which can carry host names, ports and SQL).
    """
    seen: set[int] = set()
    current: BaseException | None = error
    for _ in range(MAX_CAUSE_DEPTH):
        if current is None or id(current) in seen:
            return None
        seen.add(id(current))
        mapped = _classify(current)
        if mapped is not None:
            return mapped
        current = current.__cause__ or current.__context__
    return None


_DOWNSTREAM_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def _classify(error: BaseException) -> DomainError | None:
    if isinstance(error, ConcurrencyError):  # an optimistic append lost its race: nothing was written
        return Aborted("CONCURRENT_UPDATE", "a concurrent change won; retry with the same id")
    if isinstance(error, psycopg.errors.LockNotAvailable):
        return Unavailable("DATABASE_LOCK_TIMEOUT", "a lock wait ran out (lock_timeout); retry with the same id")
    if isinstance(error, psycopg.errors.QueryCanceled):
        return Unavailable("DATABASE_TIMEOUT", "a database statement ran out of time; retry with the same id")
    if isinstance(error, psycopg.errors.IdleInTransactionSessionTimeout):
        return Unavailable("DATABASE_TIMEOUT", "a transaction stayed open too long; retry with the same id")
    if isinstance(error, psycopg.Error) and (error.sqlstate or "").startswith("40"):  # serialization, deadlock
        return Aborted("DATABASE_CONFLICT", "a concurrent change won; retry with the same id")
    if isinstance(error, psycopg.OperationalError | psycopg.InterfaceError):
        # Connection refused or lost, pool timeout, shutdown, too many connections...
        return Unavailable("DATABASE_UNAVAILABLE", "the database is unreachable; retry later")
    if isinstance(error, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return Unavailable("REDIS_UNAVAILABLE", "redis is unreachable; retry later")
    if isinstance(error, kafka.errors.KafkaError) and (
        error.retriable or isinstance(error, kafka.errors.KafkaConnectionError | kafka.errors.BrokerNotAvailableError)
    ):
        return Unavailable("BROKER_UNAVAILABLE", "kafka is unreachable; retry later")
    if isinstance(error, grpc.aio.AioRpcError | grpc.RpcError) and _rpc_code(error) in _DOWNSTREAM_RETRYABLE:
        return Unavailable("UPSTREAM_UNAVAILABLE", "a service this call needs is unavailable; retry later")
    return None


def _rpc_code(error: grpc.RpcError) -> grpc.StatusCode | None:
    code = getattr(error, "code", None)
    if not callable(code):
        return None
    value = code()
    return value if isinstance(value, grpc.StatusCode) else None
