"""Runs one service: settings, logs, metrics, database, event store, relay, consumers, gRPC.

Each service describes itself with a ``ServiceSpec``; ``run`` wires it to the
real PostgreSQL, Kafka and Redis named by the environment.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from kafka import KafkaProducer
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from backbone import logs, restorecheck, tls, tracing
from backbone.auth import Tokens
from backbone.config import ConfigError, Settings
from backbone.consumer import ExactlyOnceConsumer
from backbone.db import open_pool
from backbone.eventstore import EventStore
from backbone.grpcserver import BackgroundTask, RunningServer, serve_forever, start_server
from backbone.handlers import BatchHandler, Handler
from backbone.healthcheck import DependencyMonitor, KafkaProbe, PostgresProbe, Probe, RedisProbe
from backbone.kafka import ensure_topics, make_consumer, make_producer, use_identity
from backbone.kafka import ssl_context as kafka_ssl_context
from backbone.lease import PartitionLeases
from backbone.metrics import serve_metrics
from backbone.migrations import check_version
from backbone.relay import OutboxRelay
from backbone.topics import Topics

log = logging.getLogger(__name__)

PARTITION_LEASE_TTL_MS = 6_000
"""The leases of the partitions a relay or consumer replica owns (``backbone.lease.PartitionLeases``):
a dead replica's partitions move to the others within this and a refresh (a third of it). A replica
refreshes its leases every third of it, not before every poll of the outbox: its writes are fenced in
PostgreSQL whatever Redis says (asking Redis on every poll was 3-7 % of a service's busy time at one
bet in flight; py-spy, ``niuniu-load --profile``)."""
RELAY_IDLE_SLEEP_S = 0.1
"""How long the relay waits after finding the outbox empty. Polling every 50 ms (three round trips
each) was 17-56 % of a service's busy time at one bet in flight, 62-68 % of the rng's; this halves it
for at most 50 ms more between a commit and its publication (a wake-up on commit would remove both)."""
RELAY_LINGER_S = 0.05
"""How long the relay waits after a batch that was not full, for more events to gather. Every batch
costs a transaction that waits for the disk (the fencing check writes its row), a flush to the broker,
and a fetch and a transaction in every consumer of the topic. Polling again at once published a
trickle of events one or two at a time: at 64 bets in flight, 30 s runs alternated on 3 December,
74 / 146 bets/s without against 144 / 186 with (machine CPU a bet 24.6 / 12.3 ms against 12.6 / 9.8)."""
GATHER_BYTES = 256 * 1024
"""What a gathering consumer's fetch waits for (``ConsumerSpec.gather_ms``): some hundreds of events."""


@dataclass
class ServiceContext:
    """What a running service hands to its servicers and consumers."""

    settings: Settings
    topics: Topics
    pool: AsyncConnectionPool
    store: EventStore
    redis: Redis
    # Verifies callers; signs this service's own calls (and, in the wallet, log-ins).
    tokens: Tokens
    # Per-instance objects a service shares between its servicers and background tasks.
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ConsumerSpec:
    name: str
    topics: Callable[[Topics], Sequence[str]]
    handler: Callable[[ServiceContext], Handler | BatchHandler]
    # Records applied per transaction. 1 for handlers that lock rows: a transaction that
    # appends events holds the event store's append lock to its commit, so taking row
    # locks after an earlier record's append could deadlock with a command in flight.
    batch_size: int = 500
    # How long the broker may hold a fetch to gather records (Kafka's fetch.max.wait.ms, with
    # fetch.min.bytes GATHER_BYTES): for consumers no caller waits on, fewer and larger
    # transactions for up to this much more lag. 0: each record as soon as it is there.
    gather_ms: int = 0
    # Partitions of a poll applied side by side (``ExactlyOnceConsumer``'s ``parallel_partitions``):
    # for handlers whose row locks are taken in one order whatever the record.
    parallel_partitions: int = 1


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    grpc_port: int
    metrics_port: int
    default_topic: Callable[[Topics], str]
    register: Callable[[grpc.aio.Server, ServiceContext], Sequence[str]]
    # The folders of the service's versioned migrations, the event store's first (niuniu-migrate applies
    # them, ``migrations.store_migrations``): at start the service checks they were all applied to its
    # schema and refuses to serve otherwise. It runs no DDL itself.
    migrations: tuple[Path, ...] | None = None
    consumers: Sequence[ConsumerSpec] = field(default_factory=tuple)
    background: Sequence[Callable[[ServiceContext], BackgroundTask]] = field(default_factory=tuple)
    # The wallet holds the issuer key that signs player, admin and auditor tokens.
    issues_user_tokens: bool = False
    # Full method names reflection must not advertise (test-only hooks when they are off).
    hidden_methods: Callable[[ServiceContext], Sequence[str]] | None = None
    # What health probes: every service keeps its events in PostgreSQL, leads its relay with a
    # Redis lease and publishes to Kafka, so by default all three.
    health_dependencies: Sequence[str] = ("postgres", "redis", "kafka")


def _consumer(
    spec: ServiceSpec, consumer_spec: ConsumerSpec, ctx: ServiceContext, owner: str, schema: str | None
) -> ExactlyOnceConsumer:
    """One of the service's consumers, on its own Kafka client and partition leases."""
    settings, topics = ctx.settings, ctx.topics
    # The group carries the topic prefix, so independent
    # deployments sharing a broker never share a group.
    group = f"{topics.prefix}{consumer_spec.name}"
    gather = (
        {"fetch_min_bytes": GATHER_BYTES, "fetch_max_wait_ms": consumer_spec.gather_ms}
        if consumer_spec.gather_ms
        else {}
    )
    kafka = make_consumer(settings.kafka_bootstrap_servers, group, f"{spec.name}-{consumer_spec.name}", **gather)
    return ExactlyOnceConsumer(
        consumer_spec.name,
        consumer_spec.topics(topics),
        ctx.pool,
        consumer_spec.handler(ctx),
        kafka,
        batch_size=consumer_spec.batch_size,
        parallel_partitions=consumer_spec.parallel_partitions,
        leases=PartitionLeases(ctx.redis, f"consumer:{group}:{schema or ''}", owner, PARTITION_LEASE_TTL_MS, ctx.pool),
    )


async def start(
    spec: ServiceSpec,
    settings: Settings,
    topics: Topics,
    *,
    schema: str | None = None,
    tokens: Tokens | None = None,
) -> tuple[RunningServer, ServiceContext]:
    """Start ``spec`` in this process (``settings.grpc_port`` 0 picks a free port).

    ``schema`` keeps all of the service's tables in that PostgreSQL schema, so tests can
    run several independent instances against one database; ``niuniu-migrate`` must have
    brought it to ``spec.migrations`` first (``SchemaBehind`` otherwise). ``tokens`` default
    to the keys named by the environment (``Tokens.from_env``).
    """
    if tokens is None:
        tokens = Tokens.from_env(spec.name, issuer=spec.issues_user_tokens)
    pool, store = await _open_store(spec, settings, topics, schema)
    redis_timeout_s = settings.redis_timeout_ms / 1000
    redis = Redis.from_url(settings.redis_url, socket_timeout=redis_timeout_s, socket_connect_timeout=redis_timeout_s)
    ctx = ServiceContext(settings, topics, pool, store, redis, tokens)
    owner = f"{socket.gethostname()}-{os.getpid()}-{id(ctx)}"
    relay = _relay(spec, ctx, owner, schema)
    tasks: list[BackgroundTask] = [relay.run]
    tasks.extend(_consumer(spec, consumer_spec, ctx, owner, schema).run for consumer_spec in spec.consumers)
    tasks.extend(make(ctx) for make in spec.background)
    running = await start_server(
        lambda server: spec.register(server, ctx),
        port=settings.grpc_port,
        host=settings.bind_host,
        background=tasks,
        reflection_enabled=os.environ.get("NIUNIU_GRPC_REFLECTION", "1") != "0",
        hidden_methods=spec.hidden_methods(ctx) if spec.hidden_methods else (),
        credentials=tls.server_credentials(spec.name),
        dependencies=dependency_monitor(spec, settings),
    )
    return running, ctx


async def _open_store(
    spec: ServiceSpec, settings: Settings, topics: Topics, schema: str | None
) -> tuple[AsyncConnectionPool, EventStore]:
    """The service's topics and pool. A schema older than this release (``SchemaBehind``) or a database
    restored behind its own topics (``restorecheck.BehindTopics``) refuses to start here, before
    anything appends: both are ConfigErrors."""
    ensure_topics(settings.kafka_bootstrap_servers, topics.specs())
    pool = await open_pool(
        settings.dsn, schema=schema, max_size=settings.db_pool_max_size, timeouts=settings.db_timeouts
    )
    try:
        async with pool.connection() as conn:
            if spec.migrations is not None:
                await check_version(conn, spec.migrations, spec.name, schema)
        await restorecheck.refuse_if_behind(
            pool, settings.kafka_bootstrap_servers, restore_checked_topics(spec, topics), spec.name
        )
    except BaseException:
        await pool.close()
        raise
    return pool, EventStore(spec.name, spec.default_topic(topics))


def _relay(spec: ServiceSpec, ctx: ServiceContext, owner: str, schema: str | None) -> OutboxRelay:
    """The outbox relay of this replica: it publishes the partitions it holds a lease on."""
    settings, topics = ctx.settings, ctx.topics

    def relay_producer() -> KafkaProducer:
        return make_producer(settings.kafka_bootstrap_servers, f"{spec.name}-relay")

    return OutboxRelay(
        spec.name,
        ctx.pool,
        relay_producer(),
        new_producer=relay_producer,
        leases=PartitionLeases(
            ctx.redis, f"relay:{topics.prefix}{spec.name}:{schema or ''}", owner, PARTITION_LEASE_TTL_MS, ctx.pool
        ),
        topics=published_topics(spec, topics),
        idle_sleep_s=RELAY_IDLE_SLEEP_S,
        linger_s=RELAY_LINGER_S,
    )


def published_topics(spec: ServiceSpec, topics: Topics) -> list[str]:
    """The topics ``spec``'s events go to: its default one and the others of its own name
    (``niuniu.<service>.*``, the names its Kafka principal may write: the rng's audit topic)."""
    own = f"{topics.prefix}niuniu.{spec.name}."
    return sorted({spec.default_topic(topics), *(t.name for t in topics.specs() if t.name.startswith(own))})


def restore_checked_topics(spec: ServiceSpec, topics: Topics) -> list[str]:
    """The topics the restore check reads at start (``restorecheck.checked_topics``)."""
    return restorecheck.checked_topics(published_topics(spec, topics), topics)


def dependency_monitor(spec: ServiceSpec, settings: Settings) -> DependencyMonitor:
    """The health monitor of ``spec``: one bounded probe per dependency it names."""
    timeout_s = settings.health.probe_timeout_ms / 1000
    makers: dict[str, Callable[[], Probe]] = {
        "postgres": lambda: PostgresProbe(settings.dsn, settings.db_timeouts),
        "redis": lambda: RedisProbe(settings.redis_url, timeout_s),
        "kafka": lambda: KafkaProbe(settings.kafka_bootstrap_servers, kafka_ssl_context()),
    }
    unknown = set(spec.health_dependencies) - set(makers)
    if unknown:
        raise ConfigError(f"unknown health dependencies {sorted(unknown)}; known: {sorted(makers)}")
    probes = {name: makers[name]() for name in spec.health_dependencies}
    return DependencyMonitor(spec.name, probes, settings.health)


async def _run(spec: ServiceSpec) -> None:
    settings = Settings.from_env(spec.name, grpc_port=spec.grpc_port, metrics_port=spec.metrics_port)
    tracing.configure(spec.name)  # off unless NIUNIU_OTLP_ENDPOINT is set
    use_identity(spec.name)  # Kafka clients authenticate as NIUNIU_<SERVICE>_KAFKA_USER (else KAFKA_SASL_USERNAME)
    # Key material first: a service without it must not open a port or touch a database.
    tokens = Tokens.from_env(spec.name, issuer=spec.issues_user_tokens)
    serve_metrics(settings.metrics_port, settings.bind_host)
    running, ctx = await start(spec, settings, Topics.from_env(), schema=settings.schema, tokens=tokens)
    tune_gc()
    log.info("serving", extra={"grpc_port": running.port, "metrics_port": settings.metrics_port})
    try:
        await serve_forever(running)
    finally:
        await ctx.redis.aclose()
        await ctx.pool.close()


GC_YOUNGEST_THRESHOLD = 10_000
"""Allocations between two collections of the youngest generation (Python's default: 700)."""


def tune_gc() -> None:
    """Once a service has started: what it allocated to start (modules, protobuf descriptors, pools,
    clients) is left out of every later collection (``gc.freeze``), and the youngest generation is
    collected every ``GC_YOUNGEST_THRESHOLD`` allocations instead of 700.

    Measured (``py-spy record --native`` of the table at 1 bet in flight): the cyclic collector's
    ``gc_collect_main`` was ~18 % of the table's busy samples, each collection walking the objects
    the process started with. Reference counting frees almost everything a request allocates; the
    collector is for cycles, which still go, less often.
    """
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNGEST_THRESHOLD, middle, oldest)


def event_loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The services' event loop: ``uvloop`` (libuv, in C; the default) or ``asyncio``'s own.

    Measured with ``niuniu-load`` (README, Benchmarks): asyncio's loop, in Python, spends about a
    tenth of the table's CPU running callbacks and registering sockets (psycopg adds and removes
    a reader on every wait); with uvloop, alternating runs accepted 3-16 % more bets at the same
    CPU. ``asyncio`` is there to rule the loop out when diagnosing.
    """
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    if name == "asyncio":
        return asyncio.new_event_loop
    raise ConfigError(f"NIUNIU_EVENT_LOOP must be uvloop or asyncio, not {name!r}")


def run(spec: ServiceSpec) -> None:
    logs.configure(spec.name, os.environ.get("NIUNIU_LOG_LEVEL", "INFO"))
    try:
        with asyncio.Runner(loop_factory=event_loop_factory(os.environ.get("NIUNIU_EVENT_LOOP", "uvloop"))) as runner:
            runner.run(_run(spec))
    except ConfigError as error:
        # A clear line for the operator instead of a traceback; exit status 2 = configuration.
        log.critical("refusing to start: %s", error)
        print(f"niuniu-{spec.name}: refusing to start: {error}", file=sys.stderr)
        raise SystemExit(2) from None
