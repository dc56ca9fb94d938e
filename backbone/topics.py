"""Every Kafka topic of the system, in one place (one name everywhere).

A deployment (or a test) may set ``NIUNIU_TOPIC_PREFIX`` so several independent
systems share one broker without reading each other's events.

How a service creates a topic that does not exist yet (a cluster whose topics are
declared elsewhere, e.g. Strimzi KafkaTopic resources, only ever finds them):

- ``NIUNIU_TOPIC_REPLICATION_FACTOR``: copies of each partition (default 1: one broker);
- ``NIUNIU_TOPIC_MIN_INSYNC_REPLICAS``: the topic's ``min.insync.replicas`` (default: the
  broker's); at most the replication factor;
- ``NIUNIU_TOPIC_PARTITIONS``: ``name=count,...`` by unprefixed topic name
  (``niuniu.table.events=12``); the others keep the defaults below. Partitions of an
  existing topic are never changed here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from backbone.config import ConfigError
from backbone.kafka import TopicSpec

REPLICATION_ENV = "NIUNIU_TOPIC_REPLICATION_FACTOR"
MIN_INSYNC_ENV = "NIUNIU_TOPIC_MIN_INSYNC_REPLICAS"
PARTITIONS_ENV = "NIUNIU_TOPIC_PARTITIONS"
# Partitions of a topic created here, by unprefixed name: the keyed streams of the busy services get more.
DEFAULT_PARTITIONS = {
    "niuniu.rng.events": 3,
    "niuniu.rng.audit": 3,
    "niuniu.table.events": 6,
    "niuniu.wallet.events": 6,
    "niuniu.ledger.events": 3,
}
MAX_PARTITIONS = 1_000
MAX_REPLICATION = 16


def _count(name: str, value: str, high: int) -> int:
    try:
        count = int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r}: not a whole number") from None
    if not 1 <= count <= high:
        raise ConfigError(f"{name}={value}: must be 1..{high}")
    return count


@dataclass(frozen=True, slots=True)
class TopicSettings:
    replication_factor: int = 1
    min_insync_replicas: int | None = None
    partitions: Mapping[str, int] | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TopicSettings:
        env = os.environ if env is None else env
        replication = _count(REPLICATION_ENV, env.get(REPLICATION_ENV) or "1", MAX_REPLICATION)
        min_insync = None
        if env.get(MIN_INSYNC_ENV):
            min_insync = _count(MIN_INSYNC_ENV, env[MIN_INSYNC_ENV], MAX_REPLICATION)
            if min_insync > replication:
                raise ConfigError(f"{MIN_INSYNC_ENV}={min_insync} exceeds {REPLICATION_ENV}={replication}")
        partitions = dict(DEFAULT_PARTITIONS)
        for item in filter(None, (part.strip() for part in (env.get(PARTITIONS_ENV) or "").split(","))):
            name, sep, value = item.partition("=")
            if not sep or name.strip() not in DEFAULT_PARTITIONS:
                known = ", ".join(DEFAULT_PARTITIONS)
                raise ConfigError(f"{PARTITIONS_ENV}: {item!r} is not <topic>=<count> with a topic of {known}")
            partitions[name.strip()] = _count(f"{PARTITIONS_ENV} {name.strip()}", value.strip(), MAX_PARTITIONS)
        return cls(replication, min_insync, partitions)

    def spec(self, prefix: str, name: str) -> TopicSpec:
        spec = TopicSpec(f"{prefix}{name}", partitions=(self.partitions or DEFAULT_PARTITIONS)[name])
        config = dict(spec.config)
        if self.min_insync_replicas is not None:
            config["min.insync.replicas"] = str(self.min_insync_replicas)
        return TopicSpec(spec.name, spec.partitions, config, self.replication_factor)


@dataclass(frozen=True, slots=True)
class Topics:
    prefix: str = ""

    @classmethod
    def from_env(cls) -> Topics:
        return cls(os.environ.get("NIUNIU_TOPIC_PREFIX", ""))

    @property
    def rng_events(self) -> str:
        return f"{self.prefix}niuniu.rng.events"

    @property
    def rng_audit(self) -> str:
        """The sealed deal (deck orders, envelope amounts) travels only here, for auditors."""
        return f"{self.prefix}niuniu.rng.audit"

    @property
    def table_events(self) -> str:
        return f"{self.prefix}niuniu.table.events"

    @property
    def wallet_events(self) -> str:
        return f"{self.prefix}niuniu.wallet.events"

    @property
    def ledger_events(self) -> str:
        return f"{self.prefix}niuniu.ledger.events"

    def specs(self, settings: TopicSettings | None = None) -> list[TopicSpec]:
        """Every topic, as created when missing (``settings``: default from the environment)."""
        settings = settings or TopicSettings.from_env()
        return [settings.spec(self.prefix, name) for name in DEFAULT_PARTITIONS]
