"""Connection settings from the environment, the same names locally and under Kubernetes.

Every wait on a dependency is bounded; the bounds are settings too (defaults in brackets):

- ``NIUNIU_DB_CONNECT_TIMEOUT_S`` [5]: connecting to PostgreSQL;
- ``NIUNIU_DB_STATEMENT_TIMEOUT_MS`` [10000]: any one SQL statement (``statement_timeout``);
- ``NIUNIU_DB_LOCK_TIMEOUT_MS`` [3000]: waiting for a row or table lock (``lock_timeout``),
  shorter than the table's lease so a blocked round gives up before its lease runs out;
- ``NIUNIU_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS`` [60000]: a transaction left open and idle
  (``idle_in_transaction_session_timeout``);
- ``NIUNIU_DB_POOL_TIMEOUT_S`` [5]: a request waiting for a pooled connection;
- ``NIUNIU_REDIS_TIMEOUT_MS`` [2000]: connecting to Redis and each Redis command;
- ``NIUNIU_HEALTH_PROBE_INTERVAL_MS`` [1000] and ``NIUNIU_HEALTH_PROBE_TIMEOUT_MS`` [1000]:
  how often the health monitor probes PostgreSQL, Redis and Kafka, and how long each probe
  may take (backbone/healthcheck.py). Health turns NOT_SERVING after the first failed
  round, so within interval + timeout of a dependency going away.

How calls spread over a service's pods (backbone/tls.py, backbone/grpcserver.py):

- ``NIUNIU_GRPC_LB_POLICY`` [round_robin]: how a channel picks among the addresses its target
  resolves to (a headless Service resolves to every pod): ``round_robin`` spreads calls over
  all of them, ``pick_first`` sends every call to one;
- ``NIUNIU_GRPC_MAX_CONNECTION_AGE_MS`` [60000]: a server closes each client connection after
  about this long (gRPC adds a jitter), so clients resolve the name again and reach pods
  added since they connected;
- ``NIUNIU_GRPC_MAX_CONNECTION_AGE_GRACE_MS`` [600000]: how long calls in flight on such a
  connection may still run; a WatchTable stream older than age + grace is ended (its client
  watches again).

Database connections:

- ``NIUNIU_DB_POOL_MAX_SIZE`` [20]: the most PostgreSQL connections one process holds. Every
  pod of every service draws on one budget: replicas x pool <= max_connections - reserve
  (docs/capacity.md).

A value that is not a positive integer is a ``ConfigError`` (the service refuses to start).

A setting that still holds the manifests' placeholder (``REPLACE_ME``, in a DSN, a Redis URL
or password, a Kafka password) is a ``ConfigError`` too, in every mode: a placeholder is never
a credential, and Redis started on one would let anyone in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

DEFAULT_KAFKA = "127.0.0.1:9092"
DEFAULT_REDIS = "redis://127.0.0.1:63799/0"
DEFAULT_DSN = "postgresql://niuniu@127.0.0.1:54329/niuniu_{service}"
# Loopback unless the operator says otherwise (the Kubernetes manifests set 0.0.0.0).
DEFAULT_BIND_HOST = "127.0.0.1"


class ConfigError(ValueError):
    """A required setting is missing or malformed."""


PLACEHOLDER = "REPLACE_ME"
"""What the manifests' placeholder Secrets hold until the real values are delivered."""
# The variables that carry credentials or addresses with credentials in them.
_SECRET_PREFIXES = ("NIUNIU_", "KAFKA_", "REDIS_", "DATABASE_URL")


def refuse_placeholders(env: Mapping[str, str]) -> None:
    """ConfigError naming every setting that still holds the placeholder (never its value)."""
    names = sorted(k for k, v in env.items() if k.startswith(_SECRET_PREFIXES) and PLACEHOLDER in v)
    if names:
        raise ConfigError(
            f"{', '.join(names)} still hold the placeholder {PLACEHOLDER}: deliver the real values "
            f"(deploy/k8s/README.md, Secrets)"
        )


def _positive(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{key} must be a whole number, not {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{key} must be > 0, not {value}")
    return value


@dataclass(frozen=True, slots=True)
class DbTimeouts:
    """The bounds on every PostgreSQL wait (see the module docstring for the variables)."""

    connect_timeout_s: int = 5
    statement_timeout_ms: int = 10_000
    lock_timeout_ms: int = 3_000
    idle_in_transaction_timeout_ms: int = 60_000
    pool_timeout_s: int = 5
    # Opening the pool at start-up (PostgreSQL may still be starting next to the service).
    startup_timeout_s: float = 30.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DbTimeouts:
        env = os.environ if env is None else env
        d = cls()
        return cls(
            connect_timeout_s=_positive(env, "NIUNIU_DB_CONNECT_TIMEOUT_S", d.connect_timeout_s),
            statement_timeout_ms=_positive(env, "NIUNIU_DB_STATEMENT_TIMEOUT_MS", d.statement_timeout_ms),
            lock_timeout_ms=_positive(env, "NIUNIU_DB_LOCK_TIMEOUT_MS", d.lock_timeout_ms),
            idle_in_transaction_timeout_ms=_positive(
                env, "NIUNIU_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", d.idle_in_transaction_timeout_ms
            ),
            pool_timeout_s=_positive(env, "NIUNIU_DB_POOL_TIMEOUT_S", d.pool_timeout_s),
        )


@dataclass(frozen=True, slots=True)
class HealthSettings:
    """How the dependency monitor probes (see the module docstring)."""

    probe_interval_ms: int = 1_000
    probe_timeout_ms: int = 1_000

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HealthSettings:
        env = os.environ if env is None else env
        d = cls()
        return cls(
            probe_interval_ms=_positive(env, "NIUNIU_HEALTH_PROBE_INTERVAL_MS", d.probe_interval_ms),
            probe_timeout_ms=_positive(env, "NIUNIU_HEALTH_PROBE_TIMEOUT_MS", d.probe_timeout_ms),
        )


LB_POLICIES = ("round_robin", "pick_first")


@dataclass(frozen=True, slots=True)
class GrpcSettings:
    """How channels pick a pod and how long servers keep a connection (see the module docstring)."""

    lb_policy: str = "round_robin"
    max_connection_age_ms: int = 60_000
    max_connection_age_grace_ms: int = 600_000

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GrpcSettings:
        env = os.environ if env is None else env
        d = cls()
        policy = env.get("NIUNIU_GRPC_LB_POLICY") or d.lb_policy
        if policy not in LB_POLICIES:
            raise ConfigError(f"NIUNIU_GRPC_LB_POLICY must be one of {', '.join(LB_POLICIES)}, not {policy[:40]!r}")
        return cls(
            lb_policy=policy,
            max_connection_age_ms=_positive(env, "NIUNIU_GRPC_MAX_CONNECTION_AGE_MS", d.max_connection_age_ms),
            max_connection_age_grace_ms=_positive(
                env, "NIUNIU_GRPC_MAX_CONNECTION_AGE_GRACE_MS", d.max_connection_age_grace_ms
            ),
        )


DEFAULT_DB_POOL_MAX_SIZE = 20


MIN_DB_POOL_SIZE = 2
"""The pool keeps two connections open (``backbone.db.open_pool``): a smaller maximum cannot hold them."""


def db_pool_max_size(env: Mapping[str, str] | None = None) -> int:
    size = _positive(os.environ if env is None else env, "NIUNIU_DB_POOL_MAX_SIZE", DEFAULT_DB_POOL_MAX_SIZE)
    if size < MIN_DB_POOL_SIZE:
        raise ConfigError(f"NIUNIU_DB_POOL_MAX_SIZE must be at least {MIN_DB_POOL_SIZE}, not {size}")
    return size


DEFAULT_REDIS_TIMEOUT_MS = 2_000


def redis_timeout_ms(env: Mapping[str, str] | None = None) -> int:
    return _positive(os.environ if env is None else env, "NIUNIU_REDIS_TIMEOUT_MS", DEFAULT_REDIS_TIMEOUT_MS)


@dataclass(frozen=True, slots=True)
class Settings:
    service: str
    dsn: str
    kafka_bootstrap_servers: str
    redis_url: str
    grpc_port: int
    metrics_port: int
    # Optional PostgreSQL schema for all of the service's tables (several systems in one database).
    schema: str | None = None
    # Where gRPC and /metrics listen: NIUNIU_<SERVICE>_BIND_HOST, else NIUNIU_BIND_HOST, else loopback.
    bind_host: str = DEFAULT_BIND_HOST
    db_timeouts: DbTimeouts = field(default_factory=DbTimeouts.from_env)
    redis_timeout_ms: int = field(default_factory=redis_timeout_ms)
    db_pool_max_size: int = field(default_factory=db_pool_max_size)
    health: HealthSettings = field(default_factory=HealthSettings.from_env)

    @classmethod
    def from_env(cls, service: str, *, grpc_port: int, metrics_port: int) -> Settings:
        env = os.environ
        refuse_placeholders(env)
        return cls(
            service=service,
            dsn=service_dsn(service, env),
            kafka_bootstrap_servers=env.get("KAFKA_BOOTSTRAP_SERVERS", DEFAULT_KAFKA),
            redis_url=env.get("REDIS_URL", DEFAULT_REDIS),
            grpc_port=_port(env, f"NIUNIU_{service.upper()}_GRPC_PORT", grpc_port),
            metrics_port=_port(env, f"NIUNIU_{service.upper()}_METRICS_PORT", metrics_port),
            schema=env.get("NIUNIU_DB_SCHEMA") or None,
            bind_host=env.get(f"NIUNIU_{service.upper()}_BIND_HOST") or env.get("NIUNIU_BIND_HOST", DEFAULT_BIND_HOST),
        )


def service_dsn(service: str, env: Mapping[str, str]) -> str:
    """The database of ``service``: NIUNIU_<SERVICE>_DSN, else DATABASE_URL, else the local default."""
    return env.get(f"NIUNIU_{service.upper()}_DSN") or env.get("DATABASE_URL") or DEFAULT_DSN.format(service=service)


def _port(env: os._Environ[str], key: str, default: int) -> int:
    raw = env.get(key)
    if raw is None:
        return default
    try:
        port = int(raw)
    except ValueError:
        raise ConfigError(f"{key} must be a port number, not {raw!r}") from None
    if not 0 <= port < 65536:
        raise ConfigError(f"{key} must be 0..65535, not {port}")
    return port
