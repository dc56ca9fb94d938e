"""Every Kafka topic of the system, in one place (one name everywhere)."""

from __future__ import annotations

from backbone.kafka import TopicSpec

RNG_EVENTS = "niuniu.rng.events"
# The sealed deal (deck orders, envelope amounts) travels only here, for auditors.
RNG_AUDIT = "niuniu.rng.audit"
TABLE_EVENTS = "niuniu.table.events"
WALLET_EVENTS = "niuniu.wallet.events"
LEDGER_EVENTS = "niuniu.ledger.events"

ALL = (
    TopicSpec(RNG_EVENTS),
    TopicSpec(RNG_AUDIT),
    TopicSpec(TABLE_EVENTS, partitions=6),
    TopicSpec(WALLET_EVENTS, partitions=6),
    TopicSpec(LEDGER_EVENTS),
)
