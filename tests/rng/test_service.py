"""The rng service through gRPC on the real stack: commit, draw, split, reveal, verify."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from harness import running_service
from niuniu.rng.v1 import rng_pb2, rng_pb2_grpc
from niuniu.table.v1 import events_pb2 as table_events

from backbone.auth import DEV_SECRET, Role, Tokens, bearer
from backbone.db import open_pool
from backbone.eventstore import EventStore, NewEvent
from backbone.kafka import make_producer
from backbone.relay import OutboxRelay
from backbone.service import ServiceContext
from backbone.topics import Topics
from services.rng import fair
from services.rng.server import SPEC
from services.table.rules.cards import parse_cards

pytestmark = pytest.mark.integration

TOKENS = Tokens(DEV_SECRET)
TABLE = bearer(TOKENS.service_token("table"))
WALLET = bearer(TOKENS.service_token("wallet"))
PLAYER = bearer(TOKENS.issue("player:42", Role.PLAYER))
ADMIN = bearer(TOKENS.issue("admin-1", Role.ADMIN))


@pytest.fixture
async def rng(infra: dict[str, str], unique: str) -> AsyncIterator[tuple[rng_pb2_grpc.RngStub, ServiceContext, str]]:
    prefix = f"t{unique}."
    async with (
        running_service(SPEC, infra, prefix=prefix, schema=f"rng_{unique}") as (running, ctx),
        grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel,
    ):
        yield rng_pb2_grpc.RngStub(channel), ctx, prefix


async def settle_round(infra: dict[str, str], prefix: str, schema: str, round_id: str) -> None:
    """Play the table's part: publish table.round_settled for the round on the (prefixed) table topic."""
    topics = Topics(prefix)
    pool = await open_pool(infra["DATABASE_URL"], schema=schema)
    try:
        store = EventStore("table", topics.table_events)
        async with pool.connection() as conn:
            await store.setup(conn)
            async with conn.transaction():
                version = await store.stream_version(conn, "table-1")
                settled = table_events.RoundSettled(table_id="table-1", round_id=round_id, variant="golden_bull")
                await store.append(
                    conn, "table-1", version, [NewEvent("table.round_settled", settled, correlation_id=round_id)]
                )
        await OutboxRelay("table", pool, make_producer(infra["KAFKA_BOOTSTRAP_SERVERS"], "fake-table")).publish_once()
    finally:
        await pool.close()


async def reveal_when_closed(stub: rng_pb2_grpc.RngStub, round_id: str) -> rng_pb2.RevealResponse:
    deadline = time.monotonic() + 60
    while True:
        try:
            return await stub.Reveal(rng_pb2.RevealRequest(round_id=round_id), metadata=PLAYER)
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.FAILED_PRECONDITION or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def count_events(ctx: ServiceContext, round_id: str) -> int:
    async with ctx.pool.connection() as conn:
        return len(await ctx.store.read_correlated(conn, round_id))


@pytest.mark.parametrize("deck_size", [52, 54])
async def test_commit_draw_reveal_verify_round_trip(
    rng: tuple[rng_pb2_grpc.RngStub, ServiceContext, str], infra: dict[str, str], unique: str, deck_size: int
) -> None:
    stub, _, prefix = rng
    round_id = f"r-{unique}-{deck_size}"
    commitment = (
        await stub.Commit(rng_pb2.CommitRequest(round_id=round_id, purpose="deck"), metadata=TABLE)
    ).commitment
    drawn = await stub.Draw(
        rng_pb2.DrawRequest(round_id=round_id, deck_size=deck_size, client_seed="c"), metadata=TABLE
    )
    assert len(drawn.cards) == deck_size and drawn.commitment == commitment
    split = await stub.SplitEnvelope(
        rng_pb2.SplitEnvelopeRequest(round_id=round_id, total_minor=1000, shares=5, min_minor=1, client_seed="c"),
        metadata=TABLE,
    )
    assert sum(split.amounts) == 1000 and sorted(split.grab_order) == list(range(5))

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Reveal(rng_pb2.RevealRequest(round_id=round_id), metadata=PLAYER)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "ROUND_NOT_CLOSED" in (refused.value.details() or "")

    await settle_round(infra, prefix, f"fake_table_{unique}", round_id)
    revealed = await reveal_when_closed(stub, round_id)
    seed = bytes.fromhex(revealed.server_seed)
    verification = fair.verify_round(
        commitment,
        seed,
        round_id,
        "c",
        deck_size=deck_size,
        dealt=parse_cards(list(drawn.cards)),
        envelope=fair.EnvelopeRecord(1000, 5, 1, tuple(split.amounts), tuple(split.grab_order)),
    )
    assert verification.ok, verification.failures

    tampered = bytes([seed[0] ^ 1]) + seed[1:]
    assert not fair.verify_round(commitment, tampered, round_id, "c", deck_size=deck_size).ok
    swapped = list(drawn.cards)
    swapped[0], swapped[1] = swapped[1], swapped[0]
    assert not fair.verify_round(commitment, seed, round_id, "c", deck_size=deck_size, dealt=parse_cards(swapped)).ok


async def test_repeating_calls_for_a_round_changes_nothing(
    rng: tuple[rng_pb2_grpc.RngStub, ServiceContext, str], unique: str
) -> None:
    stub, ctx, _ = rng
    round_id = f"r-{unique}"
    first = await stub.Commit(rng_pb2.CommitRequest(round_id=round_id, purpose="deck"), metadata=TABLE)
    again = await stub.Commit(rng_pb2.CommitRequest(round_id=round_id, purpose="deck"), metadata=TABLE)
    assert first.commitment == again.commitment
    request = rng_pb2.DrawRequest(round_id=round_id, deck_size=52, client_seed="x")
    a = await stub.Draw(request, metadata=TABLE)
    b = await stub.Draw(request, metadata=TABLE)
    assert list(a.cards) == list(b.cards)
    assert await count_events(ctx, round_id) == 2  # committed + drawn, once each

    with pytest.raises(grpc.aio.AioRpcError) as other:
        await stub.Draw(rng_pb2.DrawRequest(round_id=round_id, deck_size=52, client_seed="y"), metadata=TABLE)
    assert other.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert await count_events(ctx, round_id) == 2


async def test_only_the_table_service_may_draw(
    rng: tuple[rng_pb2_grpc.RngStub, ServiceContext, str], unique: str
) -> None:
    stub, ctx, _ = rng
    round_id = f"r-{unique}"
    await stub.Commit(rng_pb2.CommitRequest(round_id=round_id, purpose="deck"), metadata=TABLE)
    request = rng_pb2.DrawRequest(round_id=round_id, deck_size=52)
    for who in (PLAYER, WALLET, ADMIN):
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await stub.Draw(request, metadata=who)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as anonymous:
        await stub.Draw(request)
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
    forged = bearer(Tokens("another-secret-that-is-long-enough-1234").service_token("table"))
    with pytest.raises(grpc.aio.AioRpcError) as forged_error:
        await stub.Draw(request, metadata=forged)
    assert forged_error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert await count_events(ctx, round_id) == 1  # only the commitment


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (rng_pb2.DrawRequest(round_id="", deck_size=52), "ROUND_ID_MALFORMED"),
        (rng_pb2.DrawRequest(round_id="bad id!", deck_size=52), "ROUND_ID_MALFORMED"),
        (rng_pb2.DrawRequest(round_id="r1", deck_size=53), "DECK_SIZE_UNSUPPORTED"),
        (rng_pb2.DrawRequest(round_id="r1", deck_size=52, client_seed="x" * 300), "CLIENT_SEED_TOO_LONG"),
    ],
)
async def test_bad_input_is_invalid_argument_with_a_reason(
    rng: tuple[rng_pb2_grpc.RngStub, ServiceContext, str], request_: rng_pb2.DrawRequest, reason: str
) -> None:
    stub, _, _ = rng
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Draw(request_, metadata=TABLE)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason in (error.value.details() or "")


async def test_unknown_round_and_bad_envelope(
    rng: tuple[rng_pb2_grpc.RngStub, ServiceContext, str], unique: str
) -> None:
    stub, _, _ = rng
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await stub.Draw(rng_pb2.DrawRequest(round_id=f"nope-{unique}", deck_size=52), metadata=TABLE)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    round_id = f"r-{unique}"
    await stub.Commit(rng_pb2.CommitRequest(round_id=round_id, purpose="envelope"), metadata=TABLE)
    with pytest.raises(grpc.aio.AioRpcError) as too_small:
        await stub.SplitEnvelope(
            rng_pb2.SplitEnvelopeRequest(round_id=round_id, total_minor=3, shares=5, min_minor=1), metadata=TABLE
        )
    assert too_small.value.code() == grpc.StatusCode.INVALID_ARGUMENT
