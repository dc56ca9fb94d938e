"""Which topics a service's restore check reads at start: what its Kafka principal may read."""

from __future__ import annotations

from backbone.recover import own_topics
from backbone.restorecheck import checked_topics
from backbone.service import published_topics, restore_checked_topics
from backbone.topics import Topics
from services.ledger.server import SPEC as LEDGER
from services.rng.server import SPEC as RNG
from services.table.server import SPEC as TABLE
from services.wallet.server import SPEC as WALLET


def test_the_rng_checks_its_events_but_never_reads_the_sealed_deals() -> None:
    """Only auditors may read the audit topic (deploy/local/kafka/provision.py, the KafkaUsers): a check
    that read it would stop the rng from starting once a sealed deal is on it."""
    topics = Topics()
    assert topics.rng_audit in published_topics(RNG, topics)
    assert restore_checked_topics(RNG, topics) == [topics.rng_events]
    # ``python -m backbone.recover check rng`` runs as the rng too: the same topics.
    assert checked_topics(own_topics("rng", topics), topics) == [topics.rng_events]


def test_every_other_service_checks_every_topic_it_publishes() -> None:
    topics = Topics("t1.")
    for spec in (TABLE, WALLET, LEDGER):
        checked = restore_checked_topics(spec, topics)
        assert checked == published_topics(spec, topics) and checked, spec.name
