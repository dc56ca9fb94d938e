"""The ledger service process: `niuniu-ledger`.

Exactly-once consumers apply the journal projection to the wallet events (journal)
and the table events (round index); the gRPC API reads the journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path

import grpc
from niuniu.ledger.v1 import ledger_pb2, ledger_pb2_grpc

from backbone import service
from backbone.grpcserver import BackgroundTask
from backbone.migrations import store_migrations
from backbone.service import ConsumerSpec, ServiceContext, ServiceSpec
from backbone.topics import Topics
from services.ledger import metrics, queries
from services.ledger.api import LedgerServicer
from services.ledger.projection import CONSUMER, ROUNDS_CONSUMER, journal_batch, rounds_batch

log = logging.getLogger(__name__)

IMBALANCE_CHECK_INTERVAL_S = 15.0


def register(server: grpc.aio.Server, ctx: ServiceContext) -> Sequence[str]:
    ledger_pb2_grpc.add_LedgerServicer_to_server(LedgerServicer(ctx.pool, ctx.tokens), server)
    return [ledger_pb2.DESCRIPTOR.services_by_name["Ledger"].full_name]


def wallet_topic(topics: Topics) -> Sequence[str]:
    return [topics.wallet_events]


def table_topic(topics: Topics) -> Sequence[str]:
    return [topics.table_events]


def imbalance_watch(ctx: ServiceContext) -> BackgroundTask:
    """Keeps niuniu_ledger_imbalance_minor (it must read 0) and niuniu_ledger_journal_rejects current."""

    async def watch(stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                async with ctx.pool.connection() as conn:
                    trial = await queries.trial_balance(conn)
                    rejects = await queries.reject_count(conn)
                metrics.IMBALANCE_MINOR.set(trial.imbalance_minor)
                metrics.JOURNAL_REJECTS.set(rejects)
                if trial.imbalance_minor:
                    log.error("the journal does not balance", extra={"imbalance_minor": trial.imbalance_minor})
            except Exception:
                log.exception("imbalance check failed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), IMBALANCE_CHECK_INTERVAL_S)

    return watch


GATHER_MS = 100

MIGRATIONS = store_migrations(Path(__file__).parent / "migrations")
"""This database's migrations: the event store's, then the ledger's own (niuniu-migrate)."""


SPEC = ServiceSpec(
    name="ledger",
    grpc_port=50054,
    metrics_port=9104,
    default_topic=lambda t: t.ledger_events,
    register=register,
    migrations=MIGRATIONS,
    # One consumer per topic, sharing the projection's handler (the replay reads both topics
    # as one). A group subscribed to two brand-new topics at once was seen to stay without
    # partitions (kafka-python's assignment races the new topics' metadata).
    # No caller waits on the journal: its consumers let the broker gather records for up to
    # GATHER_MS, so a busy system's events come a few dozen a transaction rather than a few.
    consumers=(
        ConsumerSpec(name=CONSUMER, topics=wallet_topic, handler=lambda ctx: journal_batch, gather_ms=GATHER_MS),
        ConsumerSpec(name=ROUNDS_CONSUMER, topics=table_topic, handler=lambda ctx: rounds_batch, gather_ms=GATHER_MS),
    ),
    background=(imbalance_watch,),
)


def main() -> None:
    service.run(SPEC)


if __name__ == "__main__":
    main()
