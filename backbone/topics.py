"""Every Kafka topic of the system, in one place (one name everywhere).

A deployment (or a test) may set ``NIUNIU_TOPIC_PREFIX`` so several independent
systems share one broker without reading each other's events.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from backbone.kafka import TopicSpec


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

    def specs(self) -> list[TopicSpec]:
        return [
            TopicSpec(self.rng_events),
            TopicSpec(self.rng_audit),
            TopicSpec(self.table_events, partitions=6),
            TopicSpec(self.wallet_events, partitions=6),
            TopicSpec(self.ledger_events),
        ]
