"""The rng service through gRPC on the real stack: commit, draw, split, reveal, verify, test envelopes."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import psycopg
import pytest
from kafka import TopicPartition
from niuniu.rng.v1 import events_pb2 as rng_events
from niuniu.rng.v1 import rng_pb2, rng_pb2_grpc
from niuniu.table.v1 import events_pb2 as table_events
from niuniu.v1 import events_pb2 as envelopes
from psycopg import sql

from backbone.auth import DEFAULT_TTL_S, Role, Tokens, bearer
from backbone.db import create_schema, open_pool
from backbone.eventstore import EventStore, NewEvent
from backbone.kafka import make_consumer, make_producer
from backbone.relay import OutboxRelay
from backbone.service import ServiceContext
from backbone.topics import Topics
from bull import fairness as fair
from bull.cards import deck, parse_cards
from services.rng.server import SPEC
from tests.harness import running_service
from tools import verify

pytestmark = pytest.mark.integration

TOKENS = Tokens.development()
TABLE = bearer(TOKENS.service_token("table", ttl_s=DEFAULT_TTL_S))  # minted at import: outlives a long suite
WALLET = bearer(TOKENS.service_token("wallet", ttl_s=DEFAULT_TTL_S))
PLAYER = bearer(TOKENS.issue("player:42", Role.PLAYER))
ADMIN = bearer(TOKENS.issue("admin-1", Role.ADMIN))


@pytest.fixture
async def rng(
    infra: dict[str, str], unique: str
) -> AsyncIterator[tuple[rng_pb2_grpc.RngAsyncStub, ServiceContext, str]]:
    prefix = f"t{unique}."
    async with (
        running_service(SPEC, infra, prefix=prefix, schema=f"rng_{unique}") as (running, ctx),
        grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel,
    ):
        yield rng_pb2_grpc.RngStub(channel), ctx, prefix


async def settle_round(infra: dict[str, str], prefix: str, schema: str, round_id: str) -> None:
    """Play the table's part: publish table.round_settled for the round on the (prefixed) table topic."""
    topics = Topics(prefix)
    async with await psycopg.AsyncConnection.connect(infra["DATABASE_URL"], autocommit=True) as conn:
        await create_schema(conn, schema)  # its own schema: never tables on the shared search path's public
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
        async with await psycopg.AsyncConnection.connect(infra["DATABASE_URL"], autocommit=True) as conn:
            await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


async def reveal_when_closed(stub: rng_pb2_grpc.RngAsyncStub, round_id: str) -> rng_pb2.RevealResponse:
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
    rng: tuple[rng_pb2_grpc.RngAsyncStub, ServiceContext, str], infra: dict[str, str], unique: str, deck_size: int
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
    rng: tuple[rng_pb2_grpc.RngAsyncStub, ServiceContext, str], unique: str
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
    rng: tuple[rng_pb2_grpc.RngAsyncStub, ServiceContext, str], unique: str
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
    forged = bearer(Tokens.ephemeral().service_token("table"))
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
    rng: tuple[rng_pb2_grpc.RngAsyncStub, ServiceContext, str], request_: rng_pb2.DrawRequest, reason: str
) -> None:
    stub, _, _ = rng
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Draw(request_, metadata=TABLE)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason in (error.value.details() or "")


async def test_unknown_round_and_bad_envelope(
    rng: tuple[rng_pb2_grpc.RngAsyncStub, ServiceContext, str], unique: str
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


# --------------------------------------------------------------------------- test envelopes (TEST ONLY hook)

TEST_DECKS_ENV = "NIUNIU_RNG_TEST_DECKS"
FORCED_AMOUNTS = [700, 100, 200]  # 700 > 2 * 1000 // 3: no seed can derive it as share 0
FORCED_GRAB_ORDER = [2, 0, 1]


@pytest.fixture
async def rng_test_decks(
    infra: dict[str, str], unique: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[rng_pb2_grpc.RngAsyncStub, ServiceContext, str]]:
    """An rng started for tests: NIUNIU_RNG_TEST_DECKS=1 in development mode."""
    monkeypatch.setenv(TEST_DECKS_ENV, "1")
    monkeypatch.setenv("NIUNIU_ENV", "development")
    prefix = f"t{unique}."
    async with (
        running_service(SPEC, infra, prefix=prefix, schema=f"rng_{unique}") as (running, ctx),
        grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel,
    ):
        assert ctx.extras["test_decks"] is True
        yield rng_pb2_grpc.RngStub(channel), ctx, prefix


def envelope_request(round_id: str, amounts: list[int], grab_order: list[int]) -> rng_pb2.SetTestEnvelopeRequest:
    return rng_pb2.SetTestEnvelopeRequest(round_id=round_id, amounts=amounts, grab_order=grab_order)


def split_request(
    round_id: str, total_minor: int = 1000, shares: int = 3, min_minor: int = 1
) -> rng_pb2.SplitEnvelopeRequest:
    return rng_pb2.SplitEnvelopeRequest(
        round_id=round_id, total_minor=total_minor, shares=shares, min_minor=min_minor, client_seed="c"
    )


async def expect_refused(call: Awaitable[object], code: grpc.StatusCode, reason: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    assert refused.value.code() == code, refused.value
    assert reason in (refused.value.details() or ""), refused.value.details()


async def sealed_split(ctx: ServiceContext, round_id: str) -> tuple[dict[str, Any], str]:
    """The round's sealed envelope record, opened with the seed from the rng's database, and its outbox topic."""
    async with ctx.pool.connection() as conn:
        (stored,) = [
            e for e in await ctx.store.read_correlated(conn, round_id) if e.event_type == "rng.envelope_sealed"
        ]
        cur = await conn.execute("SELECT topic FROM outbox WHERE position = %s", (stored.position,))
        row = await cur.fetchone()
        cur = await conn.execute("SELECT server_seed FROM rng_rounds WHERE round_id = %s", (round_id,))
        seed_row = await cur.fetchone()
    sealed = rng_events.Sealed()
    assert stored.envelope.payload.Unpack(sealed)
    assert row is not None and seed_row is not None
    record = fair.open_record(bytes(seed_row[0]), "envelope", round_id, sealed.nonce, sealed.ciphertext)
    return record, str(row[0])


async def test_test_envelopes_are_refused_by_default(
    rng: tuple[rng_pb2_grpc.RngAsyncStub, ServiceContext, str], unique: str
) -> None:
    stub, ctx, _ = rng
    round_id = f"r-{unique}"
    request = envelope_request(round_id, FORCED_AMOUNTS, FORCED_GRAB_ORDER)
    failed = grpc.StatusCode.FAILED_PRECONDITION
    await expect_refused(stub.SetTestEnvelope(request, metadata=ADMIN), failed, "TEST_DECKS_DISABLED")
    await expect_refused(
        stub.SetTestEnvelope(request, metadata=PLAYER), grpc.StatusCode.PERMISSION_DENIED, "ROLE_NOT_ALLOWED"
    )
    await expect_refused(stub.SetTestEnvelope(request), grpc.StatusCode.UNAUTHENTICATED, "TOKEN_MISSING")
    # The derived split, as always: nothing was stored for the round.
    await stub.Commit(rng_pb2.CommitRequest(round_id=round_id, purpose="envelope"), metadata=TABLE)
    split = await stub.SplitEnvelope(split_request(round_id), metadata=TABLE)
    assert list(split.amounts) != FORCED_AMOUNTS
    sealed, _ = await sealed_split(ctx, round_id)
    assert sealed["test_envelope"] is False


async def test_only_admins_may_set_a_test_envelope(
    rng_test_decks: tuple[rng_pb2_grpc.RngAsyncStub, ServiceContext, str], unique: str
) -> None:
    stub, _, _ = rng_test_decks
    request = envelope_request(f"r-{unique}", FORCED_AMOUNTS, FORCED_GRAB_ORDER)
    for who in (PLAYER, TABLE, WALLET):
        await expect_refused(
            stub.SetTestEnvelope(request, metadata=who), grpc.StatusCode.PERMISSION_DENIED, "ROLE_NOT_ALLOWED"
        )
    await expect_refused(stub.SetTestEnvelope(request), grpc.StatusCode.UNAUTHENTICATED, "TOKEN_MISSING")


@pytest.mark.parametrize(
    ("round_id", "amounts", "grab_order", "reason"),
    [
        ("bad id!", [500, 500], [0, 1], "ROUND_ID_MALFORMED"),
        ("r1", [], [], "TEST_ENVELOPE_INVALID"),
        ("r1", [1000], [0], "TEST_ENVELOPE_INVALID"),
        ("r1", [1000, 0], [0, 1], "TEST_ENVELOPE_INVALID"),
        ("r1", [1001, -1], [0, 1], "TEST_ENVELOPE_INVALID"),
        ("r1", [fair.MAX_TOTAL_MINOR, 1], [0, 1], "TEST_ENVELOPE_INVALID"),
        ("r1", [1] * (fair.MAX_SHARES + 1), list(range(fair.MAX_SHARES + 1)), "TEST_ENVELOPE_INVALID"),
        ("r1", [500, 500], [0], "TEST_ENVELOPE_INVALID"),
        ("r1", [500, 500], [0, 1, 2], "TEST_ENVELOPE_INVALID"),
        ("r1", [500, 500], [1, 1], "TEST_ENVELOPE_INVALID"),
        ("r1", [500, 500], [1, 2], "TEST_ENVELOPE_INVALID"),
        ("r1", [500, 500], [-1, 0], "TEST_ENVELOPE_INVALID"),
    ],
)
async def test_a_malformed_test_envelope_is_invalid_argument(
    rng_test_decks: tuple[rng_pb2_grpc.RngAsyncStub, ServiceContext, str],
    round_id: str,
    amounts: list[int],
    grab_order: list[int],
    reason: str,
) -> None:
    stub, _, _ = rng_test_decks
    await expect_refused(
        stub.SetTestEnvelope(envelope_request(round_id, amounts, grab_order), metadata=ADMIN),
        grpc.StatusCode.INVALID_ARGUMENT,
        reason,
    )


async def test_a_test_envelope_is_the_split_and_fails_verification(
    rng_test_decks: tuple[rng_pb2_grpc.RngAsyncStub, ServiceContext, str],
    infra: dict[str, str],
    unique: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stub, ctx, prefix = rng_test_decks
    round_id = f"r-{unique}"
    # Allowed before the round is committed, and replaced until it is split.
    await stub.SetTestEnvelope(envelope_request(round_id, [1, 999], [1, 0]), metadata=ADMIN)
    set_ = await stub.SetTestEnvelope(envelope_request(round_id, FORCED_AMOUNTS, FORCED_GRAB_ORDER), metadata=ADMIN)
    assert (set_.round_id, set_.shares, set_.total_minor) == (round_id, 3, 1000)
    commitment = (
        await stub.Commit(rng_pb2.CommitRequest(round_id=round_id, purpose="envelope"), metadata=TABLE)
    ).commitment

    split = await stub.SplitEnvelope(split_request(round_id), metadata=TABLE)
    assert (list(split.amounts), list(split.grab_order)) == (FORCED_AMOUNTS, FORCED_GRAB_ORDER)
    again = await stub.SplitEnvelope(split_request(round_id), metadata=TABLE)
    assert (list(again.amounts), list(again.grab_order)) == (FORCED_AMOUNTS, FORCED_GRAB_ORDER)
    assert await count_events(ctx, round_id) == 2  # committed + split, once each
    sealed, topic = await sealed_split(ctx, round_id)
    assert sealed["test_envelope"] is True and sealed["amounts"] == FORCED_AMOUNTS
    assert topic == Topics(prefix).rng_audit

    await settle_round(infra, prefix, f"fake_table_{unique}", round_id)
    revealed = await reveal_when_closed(stub, round_id)
    status = verify.main(
        [
            *("--commitment", commitment, "--seed", revealed.server_seed, "--round", round_id),
            *("--client-seed", "c", "--envelope", "1000:3:1", "--json"),
            *("--split", ",".join(map(str, split.amounts)), "--grab-order", ",".join(map(str, split.grab_order))),
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert status == verify.EXIT_CHECK_FAILED and not report["ok"]
    checks = {check["name"]: check for check in report["checks"]}
    assert checks["commitment"]["ok"]
    assert not checks["split"]["ok"]
    assert checks["split"]["detail"].startswith("share 0: the table recorded 700 but the seed gives ")


@pytest.mark.parametrize(
    ("total_minor", "shares", "min_minor", "differs"),
    [
        (999, 3, 1, "it totals 1000, the split asks for total_minor 999"),
        (1000, 4, 1, "it has 3 shares, the split asks for 4"),
        (1000, 3, 101, "its smallest share is 100, below min_minor 101"),
    ],
)
async def test_a_test_envelope_that_does_not_fit_the_split_is_refused(
    rng_test_decks: tuple[rng_pb2_grpc.RngAsyncStub, ServiceContext, str],
    unique: str,
    total_minor: int,
    shares: int,
    min_minor: int,
    differs: str,
) -> None:
    stub, ctx, _ = rng_test_decks
    round_id = f"r-{unique}"
    await stub.Commit(rng_pb2.CommitRequest(round_id=round_id, purpose="envelope"), metadata=TABLE)
    await stub.SetTestEnvelope(envelope_request(round_id, FORCED_AMOUNTS, FORCED_GRAB_ORDER), metadata=ADMIN)
    await expect_refused(
        stub.SplitEnvelope(split_request(round_id, total_minor, shares, min_minor), metadata=TABLE),
        grpc.StatusCode.FAILED_PRECONDITION,
        f"TEST_ENVELOPE_MISMATCH: the test envelope of {round_id} does not fit: {differs}",
    )
    assert await count_events(ctx, round_id) == 1  # nothing split
    split = await stub.SplitEnvelope(split_request(round_id), metadata=TABLE)
    assert list(split.amounts) == FORCED_AMOUNTS


async def test_a_test_envelope_after_the_split_is_refused(
    rng_test_decks: tuple[rng_pb2_grpc.RngAsyncStub, ServiceContext, str], unique: str
) -> None:
    stub, ctx, _ = rng_test_decks
    round_id = f"r-{unique}"
    await stub.Commit(rng_pb2.CommitRequest(round_id=round_id, purpose="envelope"), metadata=TABLE)
    derived = await stub.SplitEnvelope(split_request(round_id), metadata=TABLE)
    sealed, _ = await sealed_split(ctx, round_id)
    assert sealed["test_envelope"] is False  # test mode derives rounds without a test envelope as always
    await expect_refused(
        stub.SetTestEnvelope(envelope_request(round_id, FORCED_AMOUNTS, FORCED_GRAB_ORDER), metadata=ADMIN),
        grpc.StatusCode.FAILED_PRECONDITION,
        "ROUND_ALREADY_SPLIT",
    )
    again = await stub.SplitEnvelope(split_request(round_id), metadata=TABLE)
    assert (list(again.amounts), list(again.grab_order)) == (list(derived.amounts), list(derived.grab_order))


# --------------------------------------------------------------------------- client seeds and sealed records

CLIENT_SEEDS = ["lucky7", "b0b", "Zm9vYmFy+/=", "alice-42"]
SEALED_FIELDS = {"round_id", "purpose", "version", "commitment", "nonce", "ciphertext"}


def read_topic(
    servers: str, topic: str, done: Callable[[list[envelopes.EventEnvelope]], bool], timeout_s: float = 60
) -> list[tuple[bytes, envelopes.EventEnvelope]]:
    """Every record on ``topic`` (raw value and envelope), polled from offset 0 until ``done`` or the timeout."""
    consumer = make_consumer(servers, None, "test-audit-reader")
    try:
        deadline = time.monotonic() + timeout_s
        while not (partitions := consumer.partitions_for_topic(topic)):
            assert time.monotonic() < deadline, f"topic {topic} never appeared"
            time.sleep(0.2)
        consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
        consumer.seek_to_beginning()
        records: list[tuple[bytes, envelopes.EventEnvelope]] = []
        while not done([envelope for _, envelope in records]):
            assert time.monotonic() < deadline, f"gave up on {topic}: {[e.event_type for _, e in records]}"
            for batch in consumer.poll(timeout_ms=500).values():
                for record in batch:
                    envelope = envelopes.EventEnvelope()
                    envelope.ParseFromString(record.value)
                    records.append((bytes(record.value), envelope))
        return records
    finally:
        consumer.close()


def sealed_of(
    records: list[tuple[bytes, envelopes.EventEnvelope]], round_id: str, event_type: str
) -> tuple[bytes, rng_events.Sealed]:
    ((raw, envelope),) = [(r, e) for r, e in records if e.correlation_id == round_id and e.event_type == event_type]
    sealed = rng_events.Sealed()
    assert envelope.payload.Unpack(sealed)
    return raw, sealed


async def server_seed_of(ctx: ServiceContext, round_id: str) -> bytes:
    """Peek into the rng's own database (only the test can): the seed the topics must not carry."""
    async with ctx.pool.connection() as conn:
        cur = await conn.execute("SELECT server_seed FROM rng_rounds WHERE round_id = %s", (round_id,))
        row = await cur.fetchone()
    assert row is not None
    return bytes(row[0])


async def test_the_sealed_deal_on_the_audit_topic_opens_only_after_the_reveal(
    rng: tuple[rng_pb2_grpc.RngAsyncStub, ServiceContext, str],
    infra: dict[str, str],
    unique: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stub, ctx, prefix = rng
    topics = Topics(prefix)
    round_id = f"r-{unique}"
    combined = fair.combine_client_seeds(CLIENT_SEEDS)
    commitment = (
        await stub.Commit(rng_pb2.CommitRequest(round_id=round_id, purpose="deck"), metadata=TABLE)
    ).commitment
    drawn = await stub.Draw(
        rng_pb2.DrawRequest(round_id=round_id, deck_size=52, client_seeds=CLIENT_SEEDS), metadata=TABLE
    )
    assert drawn.client_seed == combined
    split = await stub.SplitEnvelope(
        rng_pb2.SplitEnvelopeRequest(
            round_id=round_id, total_minor=68800, shares=20, min_minor=1, client_seeds=list(reversed(CLIENT_SEEDS))
        ),
        metadata=TABLE,
    )
    assert split.client_seed == combined  # the order of the contributions does not matter

    def both_sealed(events: list[envelopes.EventEnvelope]) -> bool:
        types = {e.event_type for e in events if e.correlation_id == round_id}
        return {"rng.deck_sealed", "rng.envelope_sealed"} <= types

    # In a thread: the rng's outbox relay runs on this event loop and must keep publishing.
    audit = await asyncio.to_thread(read_topic, infra["KAFKA_BOOTSTRAP_SERVERS"], topics.rng_audit, both_sealed)
    public = await asyncio.to_thread(
        read_topic,
        infra["KAFKA_BOOTSTRAP_SERVERS"],
        topics.rng_events,
        lambda events: any(e.correlation_id == round_id and e.event_type == "rng.committed" for e in events),
    )
    raw_deck, sealed_deck = sealed_of(audit, round_id, "rng.deck_sealed")
    raw_envelope, sealed_envelope = sealed_of(audit, round_id, "rng.envelope_sealed")

    # Before the reveal: nothing of the deal, and no key material, on either topic.
    for sealed in (sealed_deck, sealed_envelope):
        assert {field.name for field, _ in sealed.ListFields()} == SEALED_FIELDS
        assert (sealed.round_id, sealed.version, sealed.commitment) == (round_id, fair.SEAL_VERSION, commitment)
        assert len(sealed.nonce) == fair.SEAL_NONCE_BYTES
    assert sealed_deck.nonce != sealed_envelope.nonce
    for code in drawn.cards:
        assert f'"{code}"'.encode() not in raw_deck
    assert " ".join(drawn.cards).encode() not in raw_deck and b"cards" not in raw_deck
    assert json.dumps(list(split.amounts)).encode() not in raw_envelope and b"amounts" not in raw_envelope
    assert rng_events.EnvelopeSplit(amounts=split.amounts).SerializeToString() not in raw_envelope
    assert not any(e.event_type in ("rng.drawn", "rng.envelope_split") for _, e in audit)  # no plaintext events
    seed = await server_seed_of(ctx, round_id)
    secrets_ = [seed, seed.hex().encode()]
    for purpose in fair.SEAL_PURPOSES:
        key = fair.seal_key(seed, purpose, round_id)
        secrets_ += [key, key.hex().encode()]
    for raw, envelope in audit + public:
        if envelope.correlation_id == round_id:
            assert not any(secret in raw for secret in secrets_), envelope.event_type
    # The ciphertext's length follows from public parameters only.
    public_deck = fair.deck_record(round_id, commitment, 52, combined, CLIENT_SEEDS, [c.code for c in deck(52)])
    assert len(sealed_deck.ciphertext) == len(public_deck) + fair.SEAL_TAG_BYTES
    with pytest.raises(fair.SealError):
        fair.open_sealed(secrets.token_bytes(32), "deck", round_id, sealed_deck.nonce, sealed_deck.ciphertext)
    with pytest.raises(fair.SealError):
        fair.open_sealed(bytes.fromhex(commitment), "deck", round_id, sealed_deck.nonce, sealed_deck.ciphertext)
    await expect_refused(
        stub.Reveal(rng_pb2.RevealRequest(round_id=round_id), metadata=PLAYER),
        grpc.StatusCode.FAILED_PRECONDITION,
        "ROUND_NOT_CLOSED",
    )

    # After the reveal: both open with the revealed seed and hold exactly the deal.
    await settle_round(infra, prefix, f"fake_table_{unique}", round_id)
    revealed = await reveal_when_closed(stub, round_id)
    assert list(revealed.client_seeds) == sorted(CLIENT_SEEDS) == list(revealed.envelope_client_seeds)
    assert revealed.client_seed == revealed.envelope_client_seed == combined
    revealed_seed = bytes.fromhex(revealed.server_seed)
    deck_record = fair.open_record(revealed_seed, "deck", round_id, sealed_deck.nonce, sealed_deck.ciphertext)
    assert deck_record["cards"] == list(drawn.cards)
    assert (deck_record["client_seed"], deck_record["client_seeds"]) == (combined, sorted(CLIENT_SEEDS))
    envelope_record = fair.open_record(
        revealed_seed, "envelope", round_id, sealed_envelope.nonce, sealed_envelope.ciphertext
    )
    assert (envelope_record["amounts"], envelope_record["grab_order"]) == (list(split.amounts), list(split.grab_order))

    status = verify.main(
        [
            *("--commitment", commitment, "--seed", revealed.server_seed, "--round", round_id),
            *("--client-seeds", ",".join(CLIENT_SEEDS), "--deck", "52", "--dealt", " ".join(drawn.cards[:10])),
            *("--sealed-deck", f"{sealed_deck.nonce.hex()}:{sealed_deck.ciphertext.hex()}"),
            *("--envelope", "68800:20:1", "--split", ",".join(map(str, split.amounts))),
            *("--grab-order", ",".join(map(str, split.grab_order))),
            *("--sealed-envelope", f"{sealed_envelope.nonce.hex()}:{sealed_envelope.ciphertext.hex()}"),
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert status == verify.EXIT_OK, report
    assert [c["name"] for c in report["checks"]] == [
        "commitment",
        "client_seed",
        "deck",
        "split",
        "grab_order",
        "sealed_deck",
        "sealed_envelope",
    ]


@pytest.mark.parametrize(
    ("client_seed", "client_seeds", "reason", "detail"),
    [
        ("", ["ok", "bad seed"], "CLIENT_SEED_MALFORMED", "client_seeds[1]: a client seed may hold only"),
        ("", ["ok", ""], "CLIENT_SEED_MALFORMED", "client_seeds[1]: a client seed must not be empty"),
        ("", ["x" * 65], "CLIENT_SEED_MALFORMED", "client_seeds[0]: a client seed is at most 64 characters, got 65"),
        (
            "",
            ["é"],
            "CLIENT_SEED_MALFORMED",
            "client_seeds[0]: a client seed may hold only letters, digits and . _ ~ + / = -; character 0 is U+00E9",
        ),
        ("", ["a"] * (fair.MAX_CLIENT_SEED_CONTRIBUTIONS + 1), "CLIENT_SEEDS_TOO_MANY", "at most 100000"),
        ("lucky7", ["lucky7"], "CLIENT_SEED_MISMATCH", "client_seed must be empty or the combination"),
    ],
)
async def test_bad_client_seeds_are_invalid_argument_and_change_nothing(
    rng: tuple[rng_pb2_grpc.RngAsyncStub, ServiceContext, str],
    unique: str,
    client_seed: str,
    client_seeds: list[str],
    reason: str,
    detail: str,
) -> None:
    stub, ctx, _ = rng
    round_id = f"r-{unique}"
    await stub.Commit(rng_pb2.CommitRequest(round_id=round_id, purpose="deck"), metadata=TABLE)
    draw = rng_pb2.DrawRequest(round_id=round_id, deck_size=52, client_seed=client_seed, client_seeds=client_seeds)
    await expect_refused(stub.Draw(draw, metadata=TABLE), grpc.StatusCode.INVALID_ARGUMENT, f"{reason}: {detail}")
    split = rng_pb2.SplitEnvelopeRequest(
        round_id=round_id, total_minor=100, shares=2, min_minor=1, client_seed=client_seed, client_seeds=client_seeds
    )
    await expect_refused(stub.SplitEnvelope(split, metadata=TABLE), grpc.StatusCode.INVALID_ARGUMENT, reason)
    assert await count_events(ctx, round_id) == 1  # only the commitment
    # The combination given as client_seed is accepted, and is the same round's seed.
    combined = fair.combine_client_seeds(["lucky7"])
    first = await stub.Draw(
        rng_pb2.DrawRequest(round_id=round_id, deck_size=52, client_seed=combined, client_seeds=["lucky7"]),
        metadata=TABLE,
    )
    again = await stub.Draw(rng_pb2.DrawRequest(round_id=round_id, deck_size=52, client_seed=combined), metadata=TABLE)
    assert first.client_seed == again.client_seed == combined and list(first.cards) == list(again.cards)
