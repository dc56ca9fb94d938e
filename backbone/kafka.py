"""Kafka topics, producers and consumers, configured the one way this project uses them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.errors import TopicAlreadyExistsError

# Event topics keep everything forever and are never compacted: they are the record.
EVENT_TOPIC_CONFIG = {"retention.ms": "-1", "cleanup.policy": "delete"}
DEFAULT_PARTITIONS = 3


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int = DEFAULT_PARTITIONS
    config: dict[str, str] = field(default_factory=lambda: dict(EVENT_TOPIC_CONFIG))


def ensure_topics(bootstrap_servers: str, specs: Iterable[TopicSpec], *, timeout_ms: int = 30_000) -> list[str]:
    """Create the topics that do not exist yet; returns the names created."""
    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap_servers, client_id="niuniu-admin", request_timeout_ms=timeout_ms
    )
    try:
        existing = set(admin.list_topics())
        missing = {s.name: s for s in specs if s.name not in existing}
        if not missing:
            return []
        request = {
            name: {"num_partitions": s.partitions, "replication_factor": 1, "configs": s.config}
            for name, s in missing.items()
        }
        # Another process may create a topic between our list and create.
        with contextlib.suppress(TopicAlreadyExistsError):
            admin.create_topics(request, timeout_ms=timeout_ms, wait_for_metadata=True)
        return sorted(missing)
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
    }
    config.update(overrides)
    return KafkaProducer(**config)


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
    config.update(overrides)
    return KafkaConsumer(**config)
