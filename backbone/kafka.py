"""Kafka topics, producers and consumers, configured the one way this project uses them.

Every client authenticates with SASL/SCRAM when credentials are configured (the local
broker of ``scripts/infra`` and the Kubernetes manifests require them):

- ``NIUNIU_<IDENTITY>_KAFKA_USER`` / ``NIUNIU_<IDENTITY>_KAFKA_PASSWORD``: the principal of
  one identity (``rng``, ``table``, ``wallet``, ``ledger``, ``auditor``); a service process
  names its identity with ``use_identity`` before it makes clients;
- else ``KAFKA_SASL_USERNAME`` / ``KAFKA_SASL_PASSWORD``: the process's default principal;
- ``KAFKA_SECURITY_PROTOCOL`` (``SASL_PLAINTEXT`` when credentials are set, else
  ``PLAINTEXT``; ``SASL_SSL`` or ``SSL`` for TLS) and ``KAFKA_SASL_MECHANISM`` (``SCRAM-SHA-512``);
- ``KAFKA_SSL_CAFILE``: with a ``*SSL`` protocol, the CA that signed the brokers' certificates
  (PEM; unset: the system's trust store). Clients check the broker's name against its
  certificate: a bootstrap address must be a name (or IP) the certificate lists.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.errors import TopicAlreadyExistsError, TopicAuthorizationFailedError, for_code

from backbone.config import ConfigError

log = logging.getLogger(__name__)
# kafka-python warns "Exchanging credentials in the clear" on every SCRAM login without TLS;
# SCRAM never sends the password (a salted proof), so the warning is noise in every log.
logging.getLogger("kafka.net.sasl.scram").setLevel(logging.ERROR)

# The largest record the system sends (key, value and the record's overhead): the producers'
# ``max_request_size``, the event topics' ``max.message.bytes`` and the local broker's
# ``message.max.bytes`` (Kafka's defaults are about 1 MiB). A round's settlement event grows with
# its bets: the table bounds a round's bets (``MAX_BETS_PER_ROUND``) so its events stay well under
# this, and the event store refuses a larger event when it is written (``MAX_PAYLOAD_BYTES``), so
# no event the relay cannot send ever enters an outbox.
MAX_RECORD_BYTES = 4 * 1024 * 1024

# How long a topic keeps its records: 30 days. Older history lives in the sealed archive
# (backbone/archive.py, docs/decisions/0014-archive-segments.md), written daily, so a failed
# archive run has four weeks to be noticed and rerun before Kafka deletes what it has not copied.
RETENTION_MS = 30 * 24 * 3600 * 1000
# Records are kept as the producers send them: zstd batches (``make_producer``); a batch sent
# uncompressed (another client) is compressed by the broker. Never compacted: they are the record.
EVENT_TOPIC_CONFIG = {
    "retention.ms": str(RETENTION_MS),
    "cleanup.policy": "delete",
    "compression.type": "zstd",
    "max.message.bytes": str(MAX_RECORD_BYTES),
}
DEFAULT_PARTITIONS = 3


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int = DEFAULT_PARTITIONS
    config: dict[str, str] = field(default_factory=lambda: dict(EVENT_TOPIC_CONFIG))
    replication_factor: int = 1


SECURITY_KEYS = (
    "security_protocol",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
    "ssl_cafile",
    "ssl_check_hostname",
)
PROTOCOLS = ("PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL")
CAFILE_ENV = "KAFKA_SSL_CAFILE"
DEFAULT_SASL_MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True, slots=True)
class KafkaCredentials:
    """One SASL principal: who a client is to the broker's ACLs."""

    username: str
    password: str = field(repr=False)
    mechanism: str = DEFAULT_SASL_MECHANISM
    security_protocol: str = "SASL_PLAINTEXT"

    def client_config(self) -> dict[str, Any]:
        return {
            "security_protocol": self.security_protocol,
            "sasl_mechanism": self.mechanism,
            "sasl_plain_username": self.username,
            "sasl_plain_password": self.password,
        }


def uses_tls(env: Mapping[str, str] | None = None) -> bool:
    """True when ``KAFKA_SECURITY_PROTOCOL`` is ``SSL`` or ``SASL_SSL``."""
    protocol = (os.environ if env is None else env).get("KAFKA_SECURITY_PROTOCOL", "")
    if protocol and protocol not in PROTOCOLS:
        raise ConfigError(f"KAFKA_SECURITY_PROTOCOL must be one of {', '.join(PROTOCOLS)}, not {protocol[:40]!r}")
    return protocol.endswith("SSL")


def tls_config(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """kafka-python's TLS settings: the brokers' CA and a host name check; empty without TLS."""
    env = os.environ if env is None else env
    if not uses_tls(env):
        return {}
    cafile = env.get(CAFILE_ENV, "")
    if cafile and not os.path.isfile(cafile):
        raise ConfigError(f"{CAFILE_ENV}: cannot read {cafile}")
    return {
        "security_protocol": env["KAFKA_SECURITY_PROTOCOL"],
        "ssl_cafile": cafile or None,
        "ssl_check_hostname": True,
    }


def ssl_context(env: Mapping[str, str] | None = None) -> ssl.SSLContext | None:
    """A TLS context that trusts the brokers' CA (``KAFKA_SSL_CAFILE``), for raw probes; None without TLS."""
    config = tls_config(env)
    if not config:
        return None
    return ssl.create_default_context(cafile=config["ssl_cafile"])


def credentials_from_env(identity: str | None = None, env: Mapping[str, str] | None = None) -> KafkaCredentials | None:
    """The principal of ``identity`` (else the process default) from the environment; None: no SASL."""
    env = os.environ if env is None else env
    pairs = [(f"NIUNIU_{identity.upper()}_KAFKA_USER", f"NIUNIU_{identity.upper()}_KAFKA_PASSWORD")] if identity else []
    pairs.append(("KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD"))
    protocol = env.get("KAFKA_SECURITY_PROTOCOL", "")
    for user_key, password_key in pairs:
        user, password = env.get(user_key, ""), env.get(password_key, "")
        if user and not password:
            raise ConfigError(f"{user_key} is set but {password_key} is not")
        if user:
            return KafkaCredentials(
                user,
                password,
                mechanism=env.get("KAFKA_SASL_MECHANISM") or DEFAULT_SASL_MECHANISM,
                security_protocol=protocol or "SASL_PLAINTEXT",
            )
    if protocol.startswith("SASL"):
        raise ConfigError(f"KAFKA_SECURITY_PROTOCOL={protocol} but no Kafka user is set (KAFKA_SASL_USERNAME)")
    return None


IDENTITIES = ("rng", "table", "wallet", "ledger", "auditor")


def default_principal_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` in which every identity authenticates as the default principal.

    For a whole system run under a topic prefix (tests, benchmarks, load runs): a prefixed
    ACL matches the start of a name only, so the services' own ACLs (on ``niuniu.<service>.*``)
    never cover ``bench1a2b.niuniu.rng.events``; the default (test) principal may use any
    topic but the system's own.
    """
    out = dict(env)
    user, password = env.get("KAFKA_SASL_USERNAME", ""), env.get("KAFKA_SASL_PASSWORD", "")
    for identity in IDENTITIES:
        keys = (f"NIUNIU_{identity.upper()}_KAFKA_USER", f"NIUNIU_{identity.upper()}_KAFKA_PASSWORD")
        for key, value in zip(keys, (user, password), strict=True):
            if user:
                out[key] = value
            else:
                out.pop(key, None)
    return out


_process_identity: str | None = None


def use_identity(identity: str | None) -> None:
    """Name the identity (``rng``, ``auditor``, ...) whose principal this process's clients use.

    Set once by a process's entry point. Code that runs several services in one process
    (tests) leaves it unset, so every client there uses the default principal.
    """
    global _process_identity
    _process_identity = identity


def security_config(identity: str | None = None) -> dict[str, Any]:
    """kafka-python settings that authenticate as ``identity`` (default: the process's identity),
    over TLS when the protocol says so."""
    credentials = credentials_from_env(identity or _process_identity)
    return {**(credentials.client_config() if credentials is not None else {}), **tls_config()}


def _with_security(config: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    config.update(tls_config())  # TLS whoever the caller authenticates as
    if not any(key in overrides for key in SECURITY_KEYS):
        config.update(security_config())
    config.update(overrides)
    return config


def make_admin(bootstrap_servers: str, client_id: str, **overrides: Any) -> KafkaAdminClient:
    return KafkaAdminClient(
        **_with_security({"bootstrap_servers": bootstrap_servers, "client_id": client_id}, overrides)
    )


def ensure_topics(bootstrap_servers: str, specs: Iterable[TopicSpec], *, timeout_ms: int = 30_000) -> list[str]:
    """Create the topics that do not exist yet; returns the names created.

    A topic this principal may not create (another service's, under ACLs) is left to its
    owner: consumers of it pick it up at their next metadata refresh.
    """
    admin = make_admin(bootstrap_servers, "niuniu-admin", request_timeout_ms=timeout_ms)
    try:
        existing = set(admin.list_topics())
        missing = {s.name: s for s in specs if s.name not in existing}
        if not missing:
            return []
        request = {
            name: {"num_partitions": s.partitions, "replication_factor": s.replication_factor, "configs": s.config}
            for name, s in missing.items()
        }
        response = admin.create_topics(request, timeout_ms=timeout_ms, raise_errors=False)
        created: list[str] = []
        for topic in response["topics"]:
            error = for_code(topic["error_code"])
            if topic["error_code"] == 0:
                created.append(topic["name"])
            elif error is TopicAuthorizationFailedError:
                log.info("not creating topic %s: this principal may not (its owner creates it)", topic["name"])
            elif error is not TopicAlreadyExistsError:  # another process may create it between list and create
                raise error(f"creating topic {topic['name']}: {topic.get('error_message') or error.__name__}")
        if created:
            admin.wait_for_topics(created, timeout_ms=timeout_ms)
        return sorted(created)
    finally:
        admin.close()


def make_producer(bootstrap_servers: str, client_id: str, **overrides: Any) -> KafkaProducer:
    """An idempotent producer that waits for every in-sync replica: no loss, no reordering on retry."""
    config: dict[str, Any] = {
        "bootstrap_servers": bootstrap_servers,
        "client_id": client_id,
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": 2,
        "max_in_flight_requests_per_connection": 5,
        "retries": 2_147_483_647,
        "delivery_timeout_ms": 120_000,
        "max_request_size": MAX_RECORD_BYTES,
        "compression_type": "zstd",  # the topics' compression.type: the broker keeps the batches as sent
    }
    return KafkaProducer(**_with_security(config, overrides))


def make_consumer(bootstrap_servers: str, group_id: str | None, client_id: str, **overrides: Any) -> KafkaConsumer:
    """A consumer that never commits on its own: positions live in PostgreSQL with the effects."""
    config: dict[str, Any] = {
        "bootstrap_servers": bootstrap_servers,
        "group_id": group_id,
        "client_id": client_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "max_poll_records": 500,
        "isolation_level": "read_committed",
        # A group that joins before a new topic's metadata arrives gets no partitions until the
        # next metadata refresh: keep that short (the default is five minutes).
        "metadata_max_age_ms": 5_000,
    }
    return KafkaConsumer(**_with_security(config, overrides))
