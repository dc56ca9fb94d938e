"""Health that tells the truth, and a command that waits for it.

``DependencyMonitor`` probes what a service needs (PostgreSQL ``SELECT 1``, Redis ``PING``,
a Kafka broker answering an ApiVersions request) every ``probe_interval_ms``, each probe
bounded by ``probe_timeout_ms``, and turns the gRPC health of the service NOT_SERVING after
the first round in which one fails, SERVING again after the first round in which all
answer. The probes run on the event loop with their own connections (never the service's
pool, never a worker thread), so a health check answers at once whatever is down.

``python -m backbone.healthcheck NAME=HOST:PORT ... [--timeout S]`` waits until gRPC
services report SERVING.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import ssl
import struct
import sys
import time
from collections.abc import Awaitable, Callable, Mapping

import grpc
import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import Gauge
from redis.asyncio import Redis

from backbone import tls
from backbone.config import DbTimeouts, HealthSettings
from backbone.db import connect

log = logging.getLogger(__name__)

DEPENDENCY_UP = Gauge(
    "niuniu_dependency_up", "1 while the last probe of a dependency answered in time.", ["service", "dependency"]
)
MAX_REASON_CHARS = 120

Probe = Callable[[], Awaitable[None]]
"""Returns when the dependency answered; raises (or is cancelled by the monitor's timeout) when not."""


class PostgresProbe:
    """``SELECT 1`` on a connection of its own, reopened after any failure."""

    def __init__(self, dsn: str, timeouts: DbTimeouts | None = None) -> None:
        self._dsn = dsn
        self._timeouts = timeouts
        self._conn: psycopg.AsyncConnection | None = None

    async def __call__(self) -> None:
        try:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = await connect(self._dsn, autocommit=True, timeouts=self._timeouts)
            await self._conn.execute("SELECT 1")
        except BaseException:
            self.close()  # its state is unknown after a failure or a cancelled wait
            raise

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.pgconn.finish()  # no round trip: the server may be the thing that is gone

    async def aclose(self) -> None:
        self.close()


class RedisProbe:
    """``PING`` on a client of its own whose socket waits are bounded."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self._redis = Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)

    async def __call__(self) -> None:
        await self._redis.ping()

    async def aclose(self) -> None:
        await self._redis.aclose()


class KafkaProbe:
    """A broker of the bootstrap list answers an ApiVersions request (any one will do).

    ApiVersions is the one request a broker answers before authentication, so the probe
    needs no credentials, and an answer (not just an accepted connection: a stopped broker's
    kernel still accepts) shows the broker is working. Over TLS (``ssl_context``, for ``SSL``
    and ``SASL_SSL`` listeners: ``backbone.kafka.ssl_context``) the handshake checks the
    broker's certificate first.
    """

    API_VERSIONS_KEY = 18
    CLIENT_ID = b"niuniu-health"
    MAX_RESPONSE_BYTES = 1 << 20

    def __init__(self, bootstrap_servers: str, ssl_context: ssl.SSLContext | None = None) -> None:
        self._servers = [_host_port(item) for item in bootstrap_servers.split(",") if item.strip()]
        self._ssl = ssl_context
        self._correlation_id = 0

    async def __call__(self) -> None:
        errors: list[str] = []
        for host, port in self._servers:
            try:
                await self._ask(host, port)
                return
            except (OSError, ValueError, asyncio.IncompleteReadError) as error:  # ssl.SSLError is an OSError
                errors.append(f"{host}:{port}: {type(error).__name__}")
        raise ConnectionError("no Kafka broker answered (" + "; ".join(errors) + ")")

    async def _ask(self, host: str, port: int) -> None:
        self._correlation_id = (self._correlation_id + 1) % (1 << 31)
        header = struct.pack(">hhih", self.API_VERSIONS_KEY, 0, self._correlation_id, len(self.CLIENT_ID))
        request = header + self.CLIENT_ID
        reader, writer = await asyncio.open_connection(host, port, ssl=self._ssl)
        try:
            writer.write(struct.pack(">i", len(request)) + request)
            await writer.drain()
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            if not 6 <= size <= self.MAX_RESPONSE_BYTES:
                raise ValueError(f"unexpected response size {size}")
            correlation_id, error_code = struct.unpack(">ih", (await reader.readexactly(size))[:6])
            if correlation_id != self._correlation_id or error_code != 0:
                raise ValueError(f"unexpected ApiVersions answer (error code {error_code})")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), timeout=0.1)


def _host_port(item: str) -> tuple[str, int]:
    host, _, port = item.strip().rpartition(":")
    return host.strip("[]"), int(port)


class DependencyMonitor:
    """Probes dependencies on a schedule and reports the service serving only while all answer."""

    def __init__(self, service: str, probes: Mapping[str, Probe], settings: HealthSettings | None = None) -> None:
        settings = settings or HealthSettings.from_env()
        self.service = service
        self.probes = dict(probes)
        self.interval_s = settings.probe_interval_ms / 1000
        self.timeout_s = settings.probe_timeout_ms / 1000
        self.down: dict[str, str] = {}
        self.rounds = 0

    @property
    def healthy(self) -> bool:
        return not self.down

    async def probe_once(self) -> dict[str, str]:
        """Run every probe at once, each bounded by the timeout; returns the failing ones with a reason."""
        names = list(self.probes)
        results = await asyncio.gather(*(self._bounded(self.probes[n]) for n in names))
        down = {name: reason for name, reason in zip(names, results, strict=True) if reason is not None}
        for name in names:
            DEPENDENCY_UP.labels(self.service, name).set(0 if name in down else 1)
        for name, reason in down.items():
            if name not in self.down:
                log.warning("dependency unreachable", extra={"dependency": name, "reason": reason})
        for name in self.down:
            if name not in down:
                log.info("dependency reachable again", extra={"dependency": name})
        self.down = down
        self.rounds += 1
        return down

    async def _bounded(self, probe: Probe) -> str | None:
        try:
            await asyncio.wait_for(probe(), timeout=self.timeout_s)
        except TimeoutError:
            return f"no answer within {self.timeout_s:g} s"
        except Exception as error:  # any failure of a probe is the dependency's, reported not raised
            return f"{type(error).__name__}: {error}"[:MAX_REASON_CHARS]
        return None

    async def run(self, stop: asyncio.Event, report: Callable[[bool], Awaitable[None]]) -> None:
        """Probe until ``stop``; ``report(serving)`` whenever the verdict changes."""
        serving: bool | None = None
        try:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    await self.probe_once()
                except Exception:  # a bug in a probe must not stop the monitor (nor the service)
                    log.exception("dependency probe failed")
                if self.healthy != serving:
                    serving = self.healthy
                    await report(serving)
                with contextlib.suppress(TimeoutError):
                    left = max(0.0, self.interval_s - (time.monotonic() - started))
                    await asyncio.wait_for(stop.wait(), timeout=left)
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Close the probes' own connections."""
        for probe in self.probes.values():
            close = getattr(probe, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(close(), timeout=self.timeout_s)


def check(target: str, timeout_s: float = 1.0) -> str:
    """The health status name of ``target`` ('SERVING', 'NOT_SERVING', or the gRPC error)."""
    credentials = tls.channel_credentials(None)  # the operator's certificate under mutual TLS
    with grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(  # type: ignore[attr-defined]
                health_pb2.HealthCheckRequest(), timeout=timeout_s
            )
        except grpc.RpcError as error:
            return error.code().name
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def wait(targets: dict[str, str], timeout_s: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    status = {name: "UNKNOWN" for name in targets}
    while time.monotonic() < deadline:
        status = {name: check(target) for name, target in targets.items()}
        if all(s == "SERVING" for s in status.values()):
            break
        time.sleep(0.5)
    return status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("targets", nargs="+", help="NAME=HOST:PORT")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    targets = dict(item.split("=", 1) for item in args.targets)
    status = wait(targets, args.timeout)
    for name, state in status.items():
        print(f"{name:8} {targets[name]:22} {state}")
    sys.exit(0 if all(s == "SERVING" for s in status.values()) else 1)


if __name__ == "__main__":
    main()
