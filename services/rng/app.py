"""The rng application: rounds' seeds, draws, splits and reveals, with their events.

Each method is one transaction: load the round row (locked), decide with the pure
derivation in ``fair``, save the row and append the events. Repeating a call for
the same round returns the first result and appends nothing.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from niuniu.rng.v1 import events_pb2
from prometheus_client import Counter
from psycopg_pool import AsyncConnectionPool

from backbone.errors import FailedPrecondition, InvalidArgument, NotFound
from backbone.eventstore import EventStore, NewEvent
from backbone.topics import Topics
from bull import fairness as fair
from bull.cards import CardError, deck, parse_cards
from services.rng import store
from services.rng.seeds import new_seal_nonce, new_server_seed

log = logging.getLogger(__name__)

ROUND_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # matched whole (fullmatch)
PURPOSES = ("deck", "envelope")
CLIENT_SEED_MAX_CHARS = 256

COMMITS = Counter("niuniu_rng_commits_total", "Server seeds drawn and committed.")
DRAWS = Counter("niuniu_rng_draws_total", "Deck orders derived for rounds.", ["deck_size"])
SPLITS = Counter("niuniu_rng_envelope_splits_total", "Red-envelope splits derived for rounds.")
REVEALS = Counter("niuniu_rng_reveals_total", "Server seeds revealed after their round closed.")


@dataclass(frozen=True, slots=True)
class RoundSeed:
    round_id: str
    commitment: str
    server_seed: bytes
    client_seed: str
    deck_size: int
    client_seeds: tuple[str, ...] = ()
    envelope_client_seed: str = ""
    envelope_client_seeds: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClientSeed:
    """A stream's client seed and the players' contributions it combines (sorted; empty when none)."""

    value: str
    contributions: tuple[str, ...] = ()


def check_round_id(round_id: str) -> str:
    if not ROUND_ID_PATTERN.fullmatch(round_id):  # fullmatch: "$" would let a trailing newline through
        raise InvalidArgument(
            "ROUND_ID_MALFORMED", "round_id must be 1-128 characters of letters, digits and . _ : - (starting alnum)"
        )
    return round_id


def check_client_seed(client_seed: str) -> str:
    if len(client_seed) > CLIENT_SEED_MAX_CHARS:
        raise InvalidArgument("CLIENT_SEED_TOO_LONG", f"client_seed must be at most {CLIENT_SEED_MAX_CHARS} characters")
    return client_seed


def round_client_seed(client_seed: str, contributions: Sequence[str]) -> ClientSeed:
    """The client seed a draw or split uses: ``client_seed`` as given, or the combination of ``contributions``.

    INVALID_ARGUMENT CLIENT_SEEDS_TOO_MANY, CLIENT_SEED_MALFORMED (which one and why, never
    echoing it) or CLIENT_SEED_MISMATCH (a client_seed that is not their combination).
    """
    check_client_seed(client_seed)
    if not contributions:
        return ClientSeed(client_seed)
    if len(contributions) > fair.MAX_CLIENT_SEED_CONTRIBUTIONS:
        raise InvalidArgument(
            "CLIENT_SEEDS_TOO_MANY",
            f"at most {fair.MAX_CLIENT_SEED_CONTRIBUTIONS} client_seeds per round, got {len(contributions)}",
        )
    for index, contribution in enumerate(contributions):
        try:
            fair.check_client_seed_contribution(contribution)
        except fair.ClientSeedError as error:
            raise InvalidArgument("CLIENT_SEED_MALFORMED", f"client_seeds[{index}]: {error}") from None
    combined = fair.combine_client_seeds(contributions)
    if client_seed and client_seed != combined:
        raise InvalidArgument(
            "CLIENT_SEED_MISMATCH", "client_seed must be empty or the combination of client_seeds (docs/fairness.md)"
        )
    return ClientSeed(combined, tuple(sorted(contributions)))


def check_test_envelope(amounts: Sequence[int], grab_order: Sequence[int]) -> fair.Split:
    """TEST ONLY: a forced split as SetTestEnvelope takes it, or INVALID_ARGUMENT TEST_ENVELOPE_INVALID."""
    if len(amounts) < 2:
        raise InvalidArgument("TEST_ENVELOPE_INVALID", f"a test envelope has at least 2 shares, got {len(amounts)}")
    if min(amounts) < 1:
        raise InvalidArgument("TEST_ENVELOPE_INVALID", f"every amount must be at least 1, got {min(amounts)}")
    try:
        # The limits of a derived split: at most MAX_SHARES shares, MAX_TOTAL_MINOR in all.
        fair.check_envelope(sum(amounts), len(amounts), 1)
    except fair.EnvelopeError as error:
        raise InvalidArgument("TEST_ENVELOPE_INVALID", str(error)) from None
    if sorted(grab_order) != list(range(len(amounts))):
        raise InvalidArgument(
            "TEST_ENVELOPE_INVALID",
            f"grab_order must be a permutation of 0..{len(amounts) - 1}, got {list(grab_order)}",
        )
    return fair.Split(tuple(amounts), tuple(grab_order))


def forced_split_mismatch(forced: fair.Split, total_minor: int, shares: int, min_minor: int) -> str | None:
    """How a forced split differs from the split asked for (None when it fits)."""
    differences = []
    if forced.total_minor != total_minor:
        differences.append(f"it totals {forced.total_minor}, the split asks for total_minor {total_minor}")
    if len(forced.amounts) != shares:
        differences.append(f"it has {len(forced.amounts)} shares, the split asks for {shares}")
    if min(forced.amounts) < min_minor:
        differences.append(f"its smallest share is {min(forced.amounts)}, below min_minor {min_minor}")
    return "; ".join(differences) or None


def _recorded_envelope(row: dict[str, Any]) -> tuple[Any, ...]:
    """The (total_minor, shares, min_minor, client_seed) a round's envelope was split with."""
    return (
        row["envelope_total_minor"],
        row["envelope_shares"],
        row["envelope_min_minor"],
        row["envelope_client_seed"],
    )


def stream_id(round_id: str) -> str:
    return f"rng-round-{round_id}"


class RngApp:
    def __init__(
        self, pool: AsyncConnectionPool, store: EventStore, topics: Topics, *, test_decks: bool = False
    ) -> None:
        self._pool = pool
        self._store = store
        self._topics = topics
        # TEST ONLY: honour SetTestDeck (see services/rng/server.py for how it is switched on).
        self._test_decks = test_decks

    async def commit(self, round_id: str, purpose: str) -> str:
        check_round_id(round_id)
        if purpose not in PURPOSES:
            raise InvalidArgument("PURPOSE_UNKNOWN", f"purpose must be one of {', '.join(PURPOSES)}")
        seed = new_server_seed()
        commitment = fair.commit(seed)
        async with self._pool.connection() as conn, conn.transaction():
            if not await store.insert_round(conn, round_id, purpose, seed, commitment):
                return str((await self._row(conn, round_id, lock=False))["commitment"])
            event = events_pb2.Committed(round_id=round_id, purpose=purpose, commitment=commitment)
            await self._append(conn, round_id, NewEvent("rng.committed", event, correlation_id=round_id))
        COMMITS.inc()
        return commitment

    async def commitment(self, round_id: str) -> str:
        check_round_id(round_id)
        async with self._pool.connection() as conn:
            return str((await self._row(conn, round_id, lock=False))["commitment"])

    async def draw(
        self, round_id: str, deck_size: int, client_seed: str, client_seeds: Sequence[str] = ()
    ) -> tuple[tuple[str, ...], str, str]:
        """The round's deck, its commitment and the client seed it was derived with."""
        check_round_id(round_id)
        seed = round_client_seed(client_seed, client_seeds)
        client_seed = seed.value
        if deck_size not in fair.DECK_SIZES:
            raise InvalidArgument("DECK_SIZE_UNSUPPORTED", "deck_size must be 52 or 54")
        async with self._pool.connection() as conn, conn.transaction():
            row = await self._row(conn, round_id, lock=True)
            cards = tuple(card.code for card in fair.shuffle(row["server_seed"], round_id, client_seed, deck_size))
            forced = await store.test_deck(conn, round_id) if self._test_decks else None
            if forced is not None:
                if len(forced) != deck_size:
                    raise FailedPrecondition("TEST_DECK_SIZE", f"the test deck of {round_id} has {len(forced)} cards")
                cards = forced
            if row["drawn_at"] is not None:
                if (row["deck_size"], row["client_seed"]) != (deck_size, client_seed):
                    raise FailedPrecondition(
                        "DRAW_PARAMETERS_DIFFER", "this round was already drawn with another deck size or client seed"
                    )
                return cards, row["commitment"], client_seed
            self._require_open(row)
            await store.record_draw(conn, round_id, deck_size, client_seed, seed.contributions)
            record = fair.deck_record(
                round_id,
                row["commitment"],
                deck_size,
                client_seed,
                seed.contributions,
                cards,
                test_deck=forced is not None,
            )
            sealed = self._seal(row, fair.PURPOSE_DECK, record)
            await self._append(
                conn,
                round_id,
                NewEvent("rng.deck_sealed", sealed, correlation_id=round_id, topic=self._topics.rng_audit),
            )
        DRAWS.labels(str(deck_size)).inc()
        return cards, row["commitment"], client_seed

    @staticmethod
    def _seal(row: dict[str, Any], purpose: str, record: bytes) -> events_pb2.Sealed:
        """The audit topic's copy of a deal: opens only with the server seed (docs/fairness.md, section 11).

        A fresh random nonce per record: each (round, purpose) key seals one record
        today, and a random nonce keeps a second sealing under the same key safe too.
        """
        nonce = new_seal_nonce()
        round_id = str(row["round_id"])
        return events_pb2.Sealed(
            round_id=round_id,
            purpose=purpose,
            version=fair.SEAL_VERSION,
            commitment=row["commitment"],
            nonce=nonce,
            ciphertext=fair.seal(row["server_seed"], purpose, round_id, record, nonce),
        )

    async def set_test_deck(self, round_id: str, cards: Sequence[str]) -> int:
        """TEST ONLY: the deck order the round's draw will return. FAILED_PRECONDITION unless enabled."""
        if not self._test_decks:
            raise FailedPrecondition(
                "TEST_DECKS_DISABLED", "test decks are off: they exist only in an rng started for tests"
            )
        check_round_id(round_id)
        try:
            parsed = parse_cards(list(cards))
        except CardError as error:
            raise InvalidArgument("TEST_DECK_INVALID", str(error)) from None
        if len(parsed) not in fair.DECK_SIZES or set(parsed) != set(deck(len(parsed))):
            raise InvalidArgument("TEST_DECK_INVALID", "a test deck is a full 52- or 54-card deck order")
        async with self._pool.connection() as conn, conn.transaction():
            if await store.locked_stamp(conn, round_id, "drawn_at") is not None:
                raise FailedPrecondition("ROUND_ALREADY_DRAWN", f"round {round_id} has been dealt")
            await store.save_test_deck(conn, round_id, [card.code for card in parsed])
        log.warning("TEST DECK set: this round will not verify", extra={"round_id": round_id})
        return len(parsed)

    async def set_test_envelope(self, round_id: str, amounts: Sequence[int], grab_order: Sequence[int]) -> fair.Split:
        """TEST ONLY: the split the round's SplitEnvelope will return. FAILED_PRECONDITION unless enabled."""
        if not self._test_decks:
            raise FailedPrecondition(
                "TEST_DECKS_DISABLED", "test envelopes are off: they exist only in an rng started for tests"
            )
        check_round_id(round_id)
        forced = check_test_envelope(amounts, grab_order)
        async with self._pool.connection() as conn, conn.transaction():
            if await store.locked_stamp(conn, round_id, "split_at") is not None:
                raise FailedPrecondition("ROUND_ALREADY_SPLIT", f"round {round_id}'s envelope has been split")
            await store.save_test_envelope(conn, round_id, forced.amounts, forced.grab_order)
        log.warning("TEST ENVELOPE set: this round will not verify", extra={"round_id": round_id})
        return forced

    async def _forced_split(
        self, conn: psycopg.AsyncConnection, round_id: str, total_minor: int, shares: int, min_minor: int
    ) -> fair.Split | None:
        """TEST ONLY: the round's test envelope if there is one (and test decks are on), checked against the split."""
        if not self._test_decks:
            return None
        forced = await store.test_envelope(conn, round_id)
        if forced is None:
            return None
        mismatch = forced_split_mismatch(forced, total_minor, shares, min_minor)
        if mismatch is not None:
            raise FailedPrecondition(
                "TEST_ENVELOPE_MISMATCH", f"the test envelope of {round_id} does not fit: {mismatch}"
            )
        return forced

    async def split_envelope(
        self,
        round_id: str,
        total_minor: int,
        shares: int,
        min_minor: int,
        client_seed: str,
        client_seeds: Sequence[str] = (),
    ) -> tuple[fair.Split, str, str]:
        """The round's split, its commitment and the client seed it was derived with."""
        check_round_id(round_id)
        seed = round_client_seed(client_seed, client_seeds)
        client_seed = seed.value
        try:
            fair.check_envelope(total_minor, shares, min_minor)
        except fair.EnvelopeError as error:
            raise InvalidArgument("ENVELOPE_INVALID", str(error)) from None
        params = (total_minor, shares, min_minor, client_seed)
        async with self._pool.connection() as conn, conn.transaction():
            row = await self._row(conn, round_id, lock=True)
            already_split = row["split_at"] is not None
            if already_split and _recorded_envelope(row) != params:
                raise FailedPrecondition(
                    "SPLIT_PARAMETERS_DIFFER", "this round's envelope was already split with other parameters"
                )
            forced = await self._forced_split(conn, round_id, total_minor, shares, min_minor)
            split = (
                forced
                if forced is not None
                else fair.split_envelope(row["server_seed"], round_id, client_seed, total_minor, shares, min_minor)
            )
            if already_split:
                return split, row["commitment"], client_seed
            self._require_open(row)
            await store.record_split(conn, round_id, params, seed.contributions)
            record = fair.envelope_record(
                round_id,
                row["commitment"],
                total_minor,
                shares,
                min_minor,
                client_seed,
                seed.contributions,
                split,
                test_envelope=forced is not None,
            )
            sealed = self._seal(row, fair.PURPOSE_ENVELOPE, record)
            await self._append(
                conn,
                round_id,
                NewEvent("rng.envelope_sealed", sealed, correlation_id=round_id, topic=self._topics.rng_audit),
            )
        SPLITS.inc()
        return split, row["commitment"], client_seed

    async def reveal(self, round_id: str) -> RoundSeed:
        check_round_id(round_id)
        async with self._pool.connection() as conn, conn.transaction():
            row = await self._row(conn, round_id, lock=True)
            if row["closed_at"] is None:
                raise FailedPrecondition(
                    "ROUND_NOT_CLOSED", "the seed is revealed only after the round is settled or voided"
                )
            if row["revealed_at"] is None:
                await store.mark_revealed(conn, round_id)
                event = events_pb2.Revealed(
                    round_id=round_id, server_seed=row["server_seed"].hex(), commitment=row["commitment"]
                )
                await self._append(conn, round_id, NewEvent("rng.revealed", event, correlation_id=round_id))
                REVEALS.inc()
        return RoundSeed(
            round_id,
            row["commitment"],
            row["server_seed"],
            row["client_seed"] or "",
            row["deck_size"] or 0,
            tuple(row["client_seeds"] or ()),
            row["envelope_client_seed"] or "",
            tuple(row["envelope_client_seeds"] or ()),
        )

    async def close_round(self, conn: psycopg.AsyncConnection, round_id: str, cause: str, causation_id: str) -> bool:
        """Mark the round closed (settled or voided) in the caller's transaction; False if unknown or closed."""
        if not await store.close(conn, round_id, cause):
            return False
        event = events_pb2.RoundClosed(round_id=round_id, cause=cause)
        await self._append(
            conn, round_id, NewEvent("rng.round_closed", event, correlation_id=round_id, causation_id=causation_id)
        )
        return True

    async def _row(self, conn: psycopg.AsyncConnection, round_id: str, *, lock: bool) -> dict[str, Any]:
        row = await store.round_row(conn, round_id, lock=lock)
        if row is None:
            raise NotFound("ROUND_NOT_COMMITTED", f"no commitment for round {round_id}")
        return row

    @staticmethod
    def _require_open(row: dict[str, Any]) -> None:
        if row["closed_at"] is not None:
            raise FailedPrecondition("ROUND_CLOSED", "the round is already settled or voided")

    async def _append(self, conn: psycopg.AsyncConnection, round_id: str, event: NewEvent) -> None:
        stream = stream_id(round_id)
        version = await self._store.stream_version(conn, stream)
        await self._store.append(conn, stream, version, [event])
