"""The rng service process: `niuniu-rng`."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import grpc
import psycopg
from niuniu.rng.v1 import rng_pb2, rng_pb2_grpc
from niuniu.table.v1 import events_pb2 as table_events
from niuniu.v1 import events_pb2

from backbone import service
from backbone.auth import DEVELOPMENT, ENV_MODE, development_mode
from backbone.config import ConfigError
from backbone.handlers import Handler, handling
from backbone.migrations import store_migrations
from backbone.service import ConsumerSpec, ServiceContext, ServiceSpec
from services.rng.api import RngServicer
from services.rng.app import RngApp

log = logging.getLogger(__name__)

CLOSING_EVENTS = {
    "table.round_settled": table_events.RoundSettled,
    "table.round_voided": table_events.RoundVoided,
}


TEST_DECKS_ENV = "NIUNIU_RNG_TEST_DECKS"


def test_decks_enabled() -> bool:
    """TEST ONLY: SetTestDeck works when NIUNIU_RNG_TEST_DECKS=1 *and* NIUNIU_ENV=development.

    A deployment is never in development mode, so the flag can never switch fixed decks on
    there: the service refuses to start instead of ignoring it, so the mistake is seen.
    """
    if os.environ.get(TEST_DECKS_ENV, "") != "1":
        return False
    if not development_mode():
        raise ConfigError(f"{TEST_DECKS_ENV}=1 is for tests only and refused unless {ENV_MODE}={DEVELOPMENT}")
    log.warning("%s=1: TEST DECKS ENABLED; rounds dealt from one do not verify. Never in production.", TEST_DECKS_ENV)
    return True


def app_for(ctx: ServiceContext) -> RngApp:
    enabled = ctx.extras.get("test_decks")
    if not isinstance(enabled, bool):
        enabled = test_decks_enabled()
        ctx.extras["test_decks"] = enabled
    return RngApp(ctx.pool, ctx.store, ctx.topics, test_decks=enabled)


def register(server: grpc.aio.Server, ctx: ServiceContext) -> Sequence[str]:
    rng_pb2_grpc.add_RngServicer_to_server(RngServicer(app_for(ctx), ctx.tokens), server)
    return [rng_pb2.DESCRIPTOR.services_by_name["Rng"].full_name]


def hidden_methods(ctx: ServiceContext) -> Sequence[str]:
    """Reflection lists the test-only hooks only where they work."""
    app_for(ctx)  # decides (once per instance) whether the hooks are on
    if ctx.extras.get("test_decks") is True:
        return ()
    rng = rng_pb2.DESCRIPTOR.services_by_name["Rng"].full_name
    return [f"{rng}.SetTestDeck", f"{rng}.SetTestEnvelope"]


def round_closer(ctx: ServiceContext) -> Handler:
    """Marks a round closed when the table settles or voids it: from then on its seed may be revealed."""
    app = app_for(ctx)

    async def handle(conn: psycopg.AsyncConnection, envelope: events_pb2.EventEnvelope) -> None:
        message_type = CLOSING_EVENTS.get(envelope.event_type)
        if message_type is None:
            return
        payload = message_type()
        envelope.payload.Unpack(payload)
        if not await app.close_round(conn, payload.round_id, envelope.event_type, envelope.event_id):
            log.info("round closed event for an unknown or closed round", extra={"round_id": payload.round_id})

    return handling(CLOSING_EVENTS, handle)  # the table's bet events are skipped without a transaction


MIGRATIONS = store_migrations(Path(__file__).parent / "migrations")
"""This database's migrations: the event store's, then the rng's own (niuniu-migrate)."""


SPEC = ServiceSpec(
    name="rng",
    grpc_port=50051,
    metrics_port=9101,
    default_topic=lambda t: t.rng_events,
    register=register,
    migrations=MIGRATIONS,
    hidden_methods=hidden_methods,
    consumers=(ConsumerSpec("rng-round-closer", lambda t: [t.table_events], round_closer, batch_size=1),),
)


def main() -> None:
    service.run(SPEC)


if __name__ == "__main__":
    main()
