"""Players' client seeds end to end: four service processes, real Kafka, PostgreSQL and Redis.

Two bets of a Golden Bull round carry client seeds (a third carries none); the round's
client seed is their order-independent combination, the deal derives from it, and
``niuniu-verify`` checks the whole round from what a player can see afterwards: the
table's round view, the rng's revealed contributions and the sealed deck of the audit
topic. A malformed client seed is refused with INVALID_ARGUMENT and places nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from kafka import TopicPartition
from niuniu.rng.v1 import events_pb2 as rng_events
from niuniu.rng.v1 import rng_pb2, rng_pb2_grpc
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from niuniu.v1 import events_pb2 as envelopes

from backbone.kafka import make_consumer
from bull import fairness as fair
from tools import verify

E2E = Path(__file__).resolve().parents[1] / "e2e"
if str(E2E) not in sys.path:
    sys.path.insert(0, str(E2E))  # the end-to-end stack and its clients, imported by their bare names

from play import Watcher, connect, expect_refused, kind, revealed_round  # noqa: E402  (tests/e2e on the path)
from players import register  # noqa: E402
from stack import Stack, running_stack  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ALICE_SEED = "alice-7f3a9c"
BOB_SEED = "b0b+/Zm9v=="
LIMITS = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=5_000,
    chips_minor=[100],
    betting_seconds=3,
    reveal_interval_ms=10,
    pause_between_rounds_ms=50,
)


@pytest.fixture(scope="module")
def stack(infra: dict[str, str]) -> Iterator[Stack]:
    with running_stack(infra, uuid.uuid4().hex[:8]) as system:
        yield system


def sealed_deck_of(servers: str, topic: str, round_id: str, timeout_s: float = 60) -> rng_events.Sealed:
    """The round's sealed deck record, read from the audit topic from offset 0."""
    consumer = make_consumer(servers, None, "e2e-auditor")
    try:
        deadline = time.monotonic() + timeout_s
        while not (partitions := consumer.partitions_for_topic(topic)):
            assert time.monotonic() < deadline, f"no topic {topic}"
            time.sleep(0.2)
        consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
        consumer.seek_to_beginning()
        while time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                for record in batch:
                    envelope = envelopes.EventEnvelope()
                    envelope.ParseFromString(record.value)
                    if envelope.correlation_id == round_id and envelope.event_type == "rng.deck_sealed":
                        sealed = rng_events.Sealed()
                        assert envelope.payload.Unpack(sealed)
                        return sealed
        raise AssertionError(f"no sealed deck for {round_id} on {topic}")
    finally:
        consumer.close()


async def test_a_round_with_two_client_seeds_verifies(stack: Stack) -> None:
    table_id = "cs-main"
    async with connect(stack) as c, grpc.aio.insecure_channel(stack.addr("rng")) as rng_channel:
        rng = rng_pb2_grpc.RngStub(rng_channel)
        alice = await register(c, f"alice{stack.run_id}", 100_000)
        bob = await register(c, f"bob{stack.run_id}", 100_000)
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant="golden_bull", limits=LIMITS), metadata=c.admin
        )
        watcher = Watcher(c, alice, table_id)
        opened = await watcher.wait_for(lambda u: kind(u) == "round_opened")
        round_id = opened.round_id

        def bet(player_name: str, n: int, area: str, client_seed: str = "") -> table_pb2.PlaceBetRequest:
            return table_pb2.PlaceBetRequest(
                command_id=f"{round_id}.{player_name}.{n}",
                table_id=table_id,
                area=area,
                amount_minor=500,
                round_id=round_id,
                client_seed=client_seed,
            )

        for malformed, reason in (("has space", "CLIENT_SEED_MALFORMED"), ("x" * 65, "CLIENT_SEED_MALFORMED")):
            await expect_refused(
                c.table.PlaceBet(bet("alice", 9, "area_1", malformed), metadata=alice.auth),
                grpc.StatusCode.INVALID_ARGUMENT,
                reason,
            )
        await c.table.PlaceBet(bet("alice", 1, "area_1", ALICE_SEED), metadata=alice.auth)
        await c.table.PlaceBet(bet("bob", 1, "area_2", BOB_SEED), metadata=bob.auth)
        await c.table.PlaceBet(bet("bob", 2, "area_3"), metadata=bob.auth)  # no client seed: contributes nothing

        view = await revealed_round(c, table_id, round_id, alice.auth)
        combined = fair.combine_client_seeds([BOB_SEED, ALICE_SEED])
        assert view.client_seed == combined
        revealed = await rng.Reveal(rng_pb2.RevealRequest(round_id=round_id), metadata=alice.auth)
        assert list(revealed.client_seeds) == sorted([ALICE_SEED, BOB_SEED])
        assert (revealed.client_seed, revealed.server_seed) == (combined, view.server_seed)
        await watcher.stop()
        rejected = [u for u in watcher.updates if kind(u) == "my_bet_placed" and u.my_bet_placed.bet_id.endswith(".9")]
        assert not rejected  # the refused bets placed nothing

    sealed = await asyncio.to_thread(
        sealed_deck_of, stack.infra["KAFKA_BOOTSTRAP_SERVERS"], f"{stack.prefix}niuniu.rng.audit", round_id
    )
    hands = {h.seat: list(h.cards) for h in view.hands}
    dealt = " ".join(card for seat in ("dealer", "area_1", "area_2", "area_3") for card in hands[seat])
    argv = ["--commitment", view.commitment, "--seed", view.server_seed, "--round", round_id]
    argv += ["--client-seed", view.client_seed, "--client-seeds", ",".join(revealed.client_seeds)]
    argv += ["--deck", "52", "--dealt", dealt, "--sealed-deck", f"{sealed.nonce.hex()}:{sealed.ciphertext.hex()}"]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = verify.main([*argv, "--json"])
    report = json.loads(out.getvalue())
    assert code == verify.EXIT_OK, report
    assert [check["name"] for check in report["checks"]] == ["commitment", "client_seed", "deck", "sealed_deck"]

    # The same round with one contribution changed does not verify.
    argv[argv.index("--client-seeds") + 1] = f"{ALICE_SEED},{BOB_SEED}x"
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert verify.main(argv) == verify.EXIT_CHECK_FAILED
    assert "FAIL  client_seed" in out.getvalue()
