"""Connection settings from the environment, the same names locally and under Kubernetes."""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_KAFKA = "127.0.0.1:9092"
DEFAULT_REDIS = "redis://127.0.0.1:63799/0"
DEFAULT_DSN = "postgresql://niuniu@127.0.0.1:54329/niuniu_{service}"
# Loopback unless the operator says otherwise (the Kubernetes manifests set 0.0.0.0).
DEFAULT_BIND_HOST = "127.0.0.1"


class ConfigError(ValueError):
    """A required setting is missing or malformed."""


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

    @classmethod
    def from_env(cls, service: str, *, grpc_port: int, metrics_port: int) -> Settings:
        env = os.environ
        dsn = env.get(f"NIUNIU_{service.upper()}_DSN") or env.get("DATABASE_URL") or DEFAULT_DSN.format(service=service)
        return cls(
            service=service,
            dsn=dsn,
            kafka_bootstrap_servers=env.get("KAFKA_BOOTSTRAP_SERVERS", DEFAULT_KAFKA),
            redis_url=env.get("REDIS_URL", DEFAULT_REDIS),
            grpc_port=_port(env, f"NIUNIU_{service.upper()}_GRPC_PORT", grpc_port),
            metrics_port=_port(env, f"NIUNIU_{service.upper()}_METRICS_PORT", metrics_port),
            schema=env.get("NIUNIU_DB_SCHEMA") or None,
            bind_host=env.get(f"NIUNIU_{service.upper()}_BIND_HOST") or env.get("NIUNIU_BIND_HOST", DEFAULT_BIND_HOST),
        )


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
