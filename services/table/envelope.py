"""68 NiuNiu, red-envelope bull (``red_envelope_bull``) at the table: bidding, the envelope, settlement.

The pure rules are ``bull/rules/red_envelope.py`` (GAME_RULES.md §4);
this module runs a round of them on the table's rows and events. A round:

1. **Bidding** (``bidding.seconds``, 18 s). Players bid for the dealer seat. A
   bid is at least ``bidding.min_minor`` and at least ``bidding.increment_minor``
   above the highest bid (the seed's "100": interpretation, 100.00 = 10 000
   minor units). The wallet holds each bid plus the dealer's three fees (hold
   ``bid.<command id>``) before the bid is recorded; the bid it beats has its
   hold released at once. The bid is recorded under the ``envelope_rounds`` row's
   lock, so of two racing bids only one can lead; a bid that lost the race has
   its hold released and is refused.
2. At the deadline the highest bid wins (``DealerChosen``): the bid is the dealer
   pool and its hold is the dealer's for the round. Nobody bid: the round is
   voided (``NO_DEALER``), nothing moves.
3. **Betting** (the table's ``betting_seconds``, 40 s by default here): one bet
   per player against the dealer (area ``dealer``), held at stake x 18 (the
   highest multiplier). ``ChangeBet`` changes the stake (the wallet resizes the
   hold) or, with 0, cancels the bet. The dealer does not bet.
4. **The envelope**: the rng splits ``envelope.total_minor`` into one share per
   participant (position 0 the dealer, then the bettors in bet order) by the
   double-mean method, at least 0.01 each, and draws the grab order; the shares
   are stored, and each grab is revealed in turn (``EnvelopeGrabbed``), one per
   ``reveal_interval_ms``. No amount leaves the server before its grab.
5. **Settlement** with the rules' ``settle``: the dealer's 0.01 voids the round
   and re-deals (the next round opens at once, ``redeal_of``); otherwise every
   transfer goes into ``RoundSettled``. The dealer pays from the pool's hold and,
   past it, from what the round's losers paid them (transfers without a hold; the
   wallet refuses more), so the dealer never loses more than the pool plus fees.
   A round with no bet, or whose envelope could not be sent (the rng failing, or
   a split that is not one valid share per participant), is voided; the latter
   is re-dealt too. Every void releases every hold of the round, bids included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import psycopg
from niuniu.table.v1 import events_pb2 as ev
from prometheus_client import Counter
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from backbone.auth import Principal, Role, require
from backbone.errors import (
    AlreadyExists,
    DomainError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from backbone.eventstore import EventStore, NewEvent
from bull import fairness as fair
from bull.cards import Card
from bull.money import Settlement
from bull.rules import _config as cfg
from bull.rules import red_envelope as re_
from services.table.common import (
    COMMAND_ID,
    MAX_STAKE_MINOR,
    ROUNDS,
    SETTLEMENT_SECONDS,
    BetReceipt,
    Phase,
    bet_stream,
    player_account,
    settlement_event,
    unix_ms,
)
from services.table.ports import RngPort, WalletPort
from services.table.variants import VARIANTS, NoSideBets, SeatHand, TableBet, Variant

if TYPE_CHECKING:
    from services.table.app import TableApp

log = logging.getLogger(__name__)

AREA = re_.AREA
MIN_SHARE_MINOR = 1  # every share at least 0.01
SPLIT_ATTEMPTS = 10
HOLD_GRACE = timedelta(hours=1)
DEFAULT_BETTING_SECONDS = 40

BID_MIN = "bidding.min_minor"
BID_INCREMENT = "bidding.increment_minor"
BIDDING_SECONDS = "bidding.seconds"
TABLE_KEYS = (BID_MIN, BID_INCREMENT, BIDDING_SECONDS)
DEFAULT_BID_MIN_MINOR = 10_000
DEFAULT_BID_INCREMENT_MINOR = 10_000
DEFAULT_BIDDING_SECONDS = 18
MAX_BID_MINOR = 10**13

BIDS = Counter("niuniu_table_bids_total", "Red-envelope dealer bids, by outcome (placed, or the refusal).", ["outcome"])
REDEALS = Counter("niuniu_table_redeals_total", "Red-envelope rounds voided and re-dealt, by cause.", ["cause"])
for _outcome in ("placed", "BID_TOO_LOW", "BIDDING_CLOSED"):
    BIDS.labels(_outcome)
for _cause in ("DEALER_GRABBED_0.01", "ENVELOPE_ERROR"):
    REDEALS.labels(_cause)

DDL = (
    """
    CREATE TABLE IF NOT EXISTS envelope_rounds (
        round_id           TEXT PRIMARY KEY,
        table_id           TEXT NOT NULL REFERENCES tables (table_id),
        bidding_closes_at  TIMESTAMPTZ NOT NULL,
        leading_bid_id     TEXT,
        highest_bid_minor  BIGINT NOT NULL DEFAULT 0,
        dealer             TEXT,
        dealer_pool_minor  BIGINT,
        dealer_hold_id     TEXT,
        dealer_hold_minor  BIGINT,
        redeal_of          TEXT,
        redeal             BOOLEAN NOT NULL DEFAULT false
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS envelope_bids (
        bid_id        TEXT PRIMARY KEY,
        round_id      TEXT NOT NULL REFERENCES envelope_rounds (round_id),
        player        TEXT NOT NULL,
        amount_minor  BIGINT NOT NULL CHECK (amount_minor > 0),
        hold_id       TEXT NOT NULL UNIQUE,
        hold_minor    BIGINT NOT NULL,
        status        TEXT NOT NULL,
        placed_at     TIMESTAMPTZ NOT NULL
    )
    """,
    "CREATE INDEX IF NOT EXISTS envelope_bids_round_idx ON envelope_bids (round_id)",
    # The shares, stored when the envelope is sent; each leaves the server in its grab's event.
    """
    CREATE TABLE IF NOT EXISTS envelope_grabs (
        round_id      TEXT NOT NULL REFERENCES envelope_rounds (round_id),
        grab_no       INT NOT NULL,
        position      INT NOT NULL,
        participant   TEXT NOT NULL,
        bet_id        TEXT,
        amount_minor  BIGINT NOT NULL CHECK (amount_minor > 0),
        PRIMARY KEY (round_id, grab_no)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS bet_changes (
        change_id     TEXT PRIMARY KEY,
        bet_id        TEXT NOT NULL REFERENCES bets (bet_id),
        stake_minor   BIGINT NOT NULL,
        changed_at    TIMESTAMPTZ NOT NULL
    )
    """,
    # One open bet per player and round at a red-envelope table (its only area is the dealer).
    "CREATE UNIQUE INDEX IF NOT EXISTS bets_one_envelope_bet_idx ON bets (round_id, player)"
    " WHERE status = 'placed' AND area = 'dealer'",
)


class OneBetPerRound(FailedPrecondition):
    """A player's second bet of a red-envelope round (they change the first instead)."""


# ---------------------------------------------------------------------------
# Configuration and the variant adapter


@dataclass(frozen=True, slots=True)
class EnvelopeTableConfig:
    rules: re_.RedEnvelopeConfig = field(default_factory=re_.RedEnvelopeConfig)
    bid_min_minor: int = DEFAULT_BID_MIN_MINOR
    bid_increment_minor: int = DEFAULT_BID_INCREMENT_MINOR
    bidding_seconds: int = DEFAULT_BIDDING_SECONDS

    @classmethod
    def from_settings(cls, settings: Mapping[str, str]) -> EnvelopeTableConfig:
        flat = dict(settings)
        minimum = cfg.as_int(BID_MIN, flat.pop(BID_MIN, DEFAULT_BID_MIN_MINOR), low=1, high=MAX_BID_MINOR)
        increment = cfg.as_int(
            BID_INCREMENT, flat.pop(BID_INCREMENT, DEFAULT_BID_INCREMENT_MINOR), low=1, high=MAX_BID_MINOR
        )
        seconds = cfg.as_int(BIDDING_SECONDS, flat.pop(BIDDING_SECONDS, DEFAULT_BIDDING_SECONDS), low=1, high=600)
        return cls(re_.load_config(flat), minimum, increment, seconds)

    def to_settings(self) -> dict[str, str]:
        return re_.config_settings(self.rules) | {
            BID_MIN: str(self.bid_min_minor),
            BID_INCREMENT: str(self.bid_increment_minor),
            BIDDING_SECONDS: str(self.bidding_seconds),
        }

    def bid_hold_minor(self, amount_minor: int) -> int:
        """A bid's hold: the pool it would be plus the dealer's three fees."""
        return re_.dealer_hold_minor(amount_minor, self.rules)

    def next_bid_minor(self, highest_minor: int) -> int:
        if not highest_minor:
            return self.bid_min_minor
        return max(self.bid_min_minor, highest_minor + self.bid_increment_minor)


class RedEnvelopeBull(NoSideBets):
    """The table's view of the variant: one area (the dealer), no cards; ``EnvelopeRounds`` runs the round."""

    variant_id = re_.VARIANT_ID
    deck_size = 0
    cards_dealt = 0
    areas: tuple[str, ...] = (AREA,)
    reveal_order: tuple[str, ...] = ()
    reveal_groups: tuple[str, ...] = ()

    def parse_config(self, settings: Mapping[str, str]) -> EnvelopeTableConfig:
        return EnvelopeTableConfig.from_settings(settings)

    def config_settings(self, config: EnvelopeTableConfig) -> dict[str, str]:
        return config.to_settings()

    def hold_minor(self, stake_minor: int, config: EnvelopeTableConfig) -> int:
        return re_.hold_minor(stake_minor, config.rules)

    def hold_multiplier(self, config: EnvelopeTableConfig) -> Fraction:
        return Fraction(config.rules.max_multiplier)

    def reveal_part(self, hand: SeatHand, group: str, config: EnvelopeTableConfig) -> SeatHand:
        raise NotImplementedError("red-envelope rounds reveal grabs, not cards")

    def deal(self, deck: Sequence[Card], config: EnvelopeTableConfig) -> dict[str, SeatHand]:
        raise NotImplementedError("red-envelope rounds are dealt by EnvelopeRounds.send")

    def settle(
        self,
        hands: Mapping[str, SeatHand],
        bets: Sequence[TableBet],
        config: EnvelopeTableConfig,
        *,
        jackpot_pool_minor: int = 0,
    ) -> Settlement:
        raise NotImplementedError("red-envelope rounds are settled by EnvelopeRounds.settle")

    def area_outcomes(self, hands: Mapping[str, SeatHand], config: EnvelopeTableConfig) -> dict[str, str]:
        return {}


RED_ENVELOPE_BULL = RedEnvelopeBull()
VARIANTS.setdefault(RED_ENVELOPE_BULL.variant_id, RED_ENVELOPE_BULL)


def is_envelope(variant: Variant | str) -> bool:
    name = variant if isinstance(variant, str) else variant.variant_id
    return name == re_.VARIANT_ID


def default_limits(variant: Variant, limits: ev.TableLimits) -> ev.TableLimits:
    """The seed's 40 s betting window when the table does not set one."""
    if is_envelope(variant) and not limits.betting_seconds:
        limits = ev.TableLimits.FromString(limits.SerializeToString())
        limits.betting_seconds = DEFAULT_BETTING_SECONDS
    return limits


@dataclass(frozen=True, slots=True)
class BidReceipt:
    bid_id: str
    round_id: str
    amount_minor: int
    hold_minor: int
    status: str
    replayed: bool


@dataclass(frozen=True, slots=True)
class Grab:
    grab_no: int
    position: int
    participant: str
    bet_id: str
    amount_minor: int


def grab_event(table_id: str, round_id: str, grab: Grab, config: EnvelopeTableConfig) -> ev.EnvelopeGrabbed:
    hand = re_.evaluate(grab.amount_minor)
    return ev.EnvelopeGrabbed(
        table_id=table_id,
        round_id=round_id,
        grab_no=grab.grab_no,
        position=grab.position,
        participant=grab.participant,
        amount_minor=grab.amount_minor,
        amount_text=hand.text,
        category=hand.category,
        points=hand.points,
        multiplier=config.rules.multiplier(hand.category),
        bet_id=grab.bet_id,
        dealer=grab.position == 0,
    )


def assign_shares(amounts: Sequence[int], grab_order: Sequence[int], participants: int) -> list[tuple[int, int]]:
    """(position, amount) per grab, after checking the split is one valid share per participant.

    Raises ValueError for an envelope error (wrong count, a share below 0.01, an order that is
    not a permutation): the round is then voided and re-dealt.
    """
    if len(amounts) != participants or len(grab_order) != participants:
        raise ValueError(f"{len(amounts)} shares for {participants} participants")
    if sorted(grab_order) != list(range(participants)):
        raise ValueError(f"grab order {list(grab_order)} is not a permutation of the participants")
    if min(amounts) < MIN_SHARE_MINOR or max(amounts) > re_.MAX_AMOUNT_MINOR:
        raise ValueError(f"a share outside 1..{re_.MAX_AMOUNT_MINOR}: {list(amounts)}")
    return [(int(position), int(amount)) for amount, position in zip(amounts, grab_order, strict=True)]


def envelope_record(total_minor: int, grabs: Sequence[ev.EnvelopeGrabbed]) -> fair.EnvelopeRecord | None:
    """A round's revealed grabs as the verifier takes them (split and grab order), None with no grab."""
    ordered = sorted(grabs, key=lambda g: g.grab_no)
    if not ordered:
        return None
    return fair.EnvelopeRecord(
        total_minor,
        len(ordered),
        MIN_SHARE_MINOR,
        amounts=tuple(g.amount_minor for g in ordered),
        grab_order=tuple(g.position for g in ordered),
    )


def fund_dealer(
    transfers: Sequence[ev.SettlementTransfer], dealer: str, hold_id: str, hold_minor: int
) -> list[ev.SettlementTransfer]:
    """The dealer pays from the pool's hold until it is spent, then from the round's credits.

    A payment that straddles the end of the hold is split in two transfers of the same kind
    and bet: the first from the hold, the rest without a hold (the wallet pays it from what
    earlier transfers of this settlement paid the dealer, and refuses more).
    """
    left = hold_minor
    funded: list[ev.SettlementTransfer] = []
    for t in transfers:
        if t.payer != dealer:
            funded.append(t)
            continue
        from_hold = min(left, t.amount_minor)
        left -= from_hold
        for amount, hold in ((from_hold, hold_id), (t.amount_minor - from_hold, "")):
            if amount:
                funded.append(
                    ev.SettlementTransfer(
                        payer=t.payer, payee=t.payee, amount_minor=amount, kind=t.kind, bet_id=t.bet_id, hold_id=hold
                    )
                )
    return funded


# ---------------------------------------------------------------------------
# The round


class EnvelopeRounds:
    """The table application's red-envelope steps and commands (see the module docstring)."""

    def __init__(
        self,
        app: TableApp,
        pool: AsyncConnectionPool,
        store: EventStore,
        wallet: WalletPort,
        rng: RngPort,
        *,
        clock: Callable[[], datetime],
    ) -> None:
        self._app = app
        self._pool = pool
        self._store = store
        self._wallet = wallet
        self._rng = rng
        self._clock = clock

    # ------------------------------------------------------------------ opening

    @staticmethod
    def config(settings: Mapping[str, str]) -> EnvelopeTableConfig:
        return EnvelopeTableConfig.from_settings(settings)

    async def redeal_of(self, table: Mapping[str, Any]) -> str:
        """The round a new round re-deals: the table's last round, if it was voided for a re-deal."""
        if not is_envelope(table["variant"]) or not table["current_round_id"]:
            return ""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT redeal FROM envelope_rounds WHERE round_id = %s", (table["current_round_id"],)
            )
            row = await cur.fetchone()
        return str(table["current_round_id"]) if row and row[0] else ""

    def windows(self, config: EnvelopeTableConfig, limits: ev.TableLimits, now: datetime) -> tuple[datetime, datetime]:
        """(bidding closes, betting closes as estimated at the opening)."""
        bidding_closes = now + timedelta(seconds=config.bidding_seconds)
        return bidding_closes, bidding_closes + timedelta(seconds=limits.betting_seconds)

    async def opened(
        self,
        conn: psycopg.AsyncConnection,
        table_id: str,
        round_id: str,
        bidding_closes: datetime,
        redeal_of: str,
        opened: ev.RoundOpened,
    ) -> None:
        """In the opening's transaction: the round's envelope row, and the bidding deadline on RoundOpened."""
        await conn.execute(
            "INSERT INTO envelope_rounds (round_id, table_id, bidding_closes_at, redeal_of) VALUES (%s, %s, %s, %s)",
            (round_id, table_id, bidding_closes, redeal_of or None),
        )
        opened.bidding_closes_at_unix_ms = unix_ms(bidding_closes)
        opened.redeal_of = redeal_of

    # ------------------------------------------------------------------ bidding

    async def place_bid(
        self, who: Principal, command_id: str, table_id: str, amount_minor: int, round_id: str = ""
    ) -> BidReceipt:
        try:
            receipt = await self._place_bid(who, command_id, table_id, amount_minor, round_id)
        except FailedPrecondition as refused:
            BIDS.labels(refused.reason).inc()
            raise
        if not receipt.replayed:
            BIDS.labels("placed").inc()
        return receipt

    async def _place_bid(
        self, who: Principal, command_id: str, table_id: str, amount_minor: int, round_id: str
    ) -> BidReceipt:
        require(who, Role.PLAYER)
        if not COMMAND_ID.match(command_id):
            raise InvalidArgument("COMMAND_ID_MALFORMED", "command_id must be 1-128 of letters, digits and . _ : -")
        if not 0 < amount_minor <= MAX_BID_MINOR:
            raise InvalidArgument("AMOUNT_INVALID", f"amount_minor must be positive (and at most {MAX_BID_MINOR})")
        player = player_account(who)
        async with self._pool.connection() as conn:
            existing = await self._bid(conn, command_id)
            if existing is not None:
                return _replay_bid(existing, player, table_id, amount_minor)
            table = await self._envelope_table(conn, table_id)
            current = await self._bidding_round(conn, table, round_id)
            config = EnvelopeTableConfig.from_settings(current["config"])
            row = await self._envelope_row(conn, current["round_id"])
            needed = config.next_bid_minor(int(row["highest_bid_minor"]))
            if amount_minor < needed:
                raise _bid_too_low(needed, int(row["highest_bid_minor"]))
        hold_id = f"bid.{command_id}"
        hold = config.bid_hold_minor(amount_minor)
        betting = timedelta(seconds=ev.TableLimits.FromString(current["limits"]).betting_seconds)
        expires = row["bidding_closes_at"] + betting
        try:
            await self._wallet.place_hold(
                hold_id, player, hold, "dealer bid", current["round_id"], unix_ms(expires + HOLD_GRACE)
            )
        except Unavailable:
            with contextlib.suppress(DomainError):
                await self._wallet.void_hold(hold_id)
            raise
        try:
            receipt, outbid_hold = await self._record_bid(
                command_id, table_id, current, player, amount_minor, hold, hold_id, config
            )
        except FailedPrecondition:
            await self._wallet.void_hold(hold_id)
            raise
        if outbid_hold:
            # Also listed in the round's settlement or void, so a lost call here is made good there.
            with contextlib.suppress(DomainError):
                await self._wallet.void_hold(outbid_hold)
        self._app._notify_table(table_id)
        return receipt

    async def _record_bid(
        self,
        command_id: str,
        table_id: str,
        current: Mapping[str, Any],
        player: str,
        amount: int,
        hold: int,
        hold_id: str,
        config: EnvelopeTableConfig,
    ) -> tuple[BidReceipt, str]:
        """Record the bid under the round's envelope row lock; (receipt, hold of the bid it beat)."""
        round_id = current["round_id"]
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute("SELECT phase FROM rounds WHERE round_id = %s FOR SHARE", (round_id,))
            phase_row = await cur.fetchone()
            row = await self._envelope_row(conn, round_id, lock=True)
            if phase_row is None or phase_row[0] != Phase.BIDDING or self._clock() >= row["bidding_closes_at"]:
                raise FailedPrecondition("BIDDING_CLOSED", "bidding closed before the bid could be recorded")
            existing = await self._bid(conn, command_id)
            if existing is not None:  # the same command raced itself: the first one won
                return _replay_bid(existing, player, table_id, amount), ""
            highest = int(row["highest_bid_minor"])
            needed = config.next_bid_minor(highest)
            if amount < needed:
                raise _bid_too_low(needed, highest)
            outbid_id = row["leading_bid_id"] or ""
            outbid_hold = ""
            if outbid_id:
                cur = await conn.execute(
                    "UPDATE envelope_bids SET status = 'outbid' WHERE bid_id = %s RETURNING hold_id", (outbid_id,)
                )
                outbid = await cur.fetchone()
                outbid_hold = str(outbid[0]) if outbid else ""
            await conn.execute(
                "INSERT INTO envelope_bids (bid_id, round_id, player, amount_minor, hold_id, hold_minor, status,"
                " placed_at) VALUES (%s, %s, %s, %s, %s, %s, 'leading', %s)",
                (command_id, round_id, player, amount, hold_id, hold, self._clock()),
            )
            await conn.execute(
                "UPDATE envelope_rounds SET leading_bid_id = %s, highest_bid_minor = %s WHERE round_id = %s",
                (command_id, amount, round_id),
            )
            placed = ev.BidPlaced(
                table_id=table_id,
                round_id=round_id,
                bid_id=command_id,
                player=player,
                amount_minor=amount,
                hold_minor=hold,
                hold_id=hold_id,
                outbid_bid_id=outbid_id,
            )
            await self._app._append_table(conn, table_id, "table.bid_placed", placed, correlation_id=round_id)
        return BidReceipt(command_id, round_id, amount, hold, "leading", False), outbid_hold

    async def close_bidding(self, current: Mapping[str, Any]) -> None:
        """The bidding deadline passed: the highest bid deals (or, with no bid, the round is voided)."""
        round_id, table_id = current["round_id"], current["table_id"]
        limits = ev.TableLimits.FromString(current["limits"])
        async with self._pool.connection() as conn, conn.transaction():
            locked = await self._app._round(conn, round_id, lock=True)
            if locked["phase"] != Phase.BIDDING:
                return
            row = await self._envelope_row(conn, round_id, lock=True)
            if self._clock() < row["bidding_closes_at"]:
                return
            leader = await self._bid(conn, row["leading_bid_id"]) if row["leading_bid_id"] else None
            if leader is not None:
                closes = self._clock() + timedelta(seconds=limits.betting_seconds)
                cur = await conn.execute("SELECT count(*) FROM envelope_bids WHERE round_id = %s", (round_id,))
                count = await cur.fetchone()
                await conn.execute("UPDATE envelope_bids SET status = 'won' WHERE bid_id = %s", (leader["bid_id"],))
                await conn.execute(
                    "UPDATE envelope_rounds SET dealer = %s, dealer_pool_minor = %s, dealer_hold_id = %s,"
                    " dealer_hold_minor = %s WHERE round_id = %s",
                    (leader["player"], leader["amount_minor"], leader["hold_id"], leader["hold_minor"], round_id),
                )
                await conn.execute(
                    "UPDATE rounds SET phase = %s, betting_closes_at = %s WHERE round_id = %s",
                    (Phase.BETTING, closes, round_id),
                )
                chosen = ev.DealerChosen(
                    table_id=table_id,
                    round_id=round_id,
                    dealer=leader["player"],
                    bid_id=leader["bid_id"],
                    dealer_pool_minor=leader["amount_minor"],
                    hold_id=leader["hold_id"],
                    hold_minor=leader["hold_minor"],
                    betting_closes_at_unix_ms=unix_ms(closes),
                    bids=int(count[0]) if count else 0,
                )
                await self._app._append_table(conn, table_id, "table.dealer_chosen", chosen, correlation_id=round_id)
        if leader is None:
            await self._app.void_round(table_id, round_id, "NO_DEALER: nobody bid for the dealer seat")
            return
        self._app._notify_table(table_id)

    # ------------------------------------------------------------------ bets

    async def check_bet(self, conn: psycopg.AsyncConnection, variant_id: str, round_id: str, player: str) -> None:
        """Before the wallet holds a red-envelope bet: not the dealer, and not a second bet."""
        if not is_envelope(variant_id):
            return
        row = await self._envelope_row(conn, round_id)
        if row["dealer"] == player:
            raise FailedPrecondition("DEALER_CANNOT_BET", "the dealer plays against the bettors, not with them")
        cur = await conn.execute(
            "SELECT bet_id FROM bets WHERE round_id = %s AND player = %s AND status = 'placed'", (round_id, player)
        )
        mine = await cur.fetchone()
        if mine is not None:
            raise OneBetPerRound(
                "ALREADY_BET", f"you have bet this round ({mine[0]}): change it with ChangeBet, or 0 to cancel"
            )

    async def change_bet(
        self, who: Principal, command_id: str, table_id: str, bet_id: str, amount_minor: int
    ) -> BetReceipt:
        """Change a bet's stake in the betting window (0 cancels it)."""
        require(who, Role.PLAYER)
        if not COMMAND_ID.match(command_id):
            raise InvalidArgument("COMMAND_ID_MALFORMED", "command_id must be 1-128 of letters, digits and . _ : -")
        if not 0 <= amount_minor <= MAX_STAKE_MINOR:
            raise InvalidArgument("AMOUNT_INVALID", "amount_minor must be 0 (cancel) or positive, at most 10^13")
        player = player_account(who)
        async with self._pool.connection() as conn:
            done = await self._change(conn, command_id)
            bet = await self._app._bet(conn, bet_id)
            if bet is None or bet["table_id"] != table_id or bet["player"] != player:
                raise NotFound("BET_NOT_FOUND", f"you have no bet {bet_id} at table {table_id}")
            if done is not None:
                if (done["bet_id"], int(done["stake_minor"])) != (bet_id, amount_minor):
                    raise AlreadyExists("COMMAND_ID_REUSED", "this command id was used for a different change")
                return _bet_receipt(bet, replayed=True)
            table = await self._app._table(conn, table_id)
        if not is_envelope(table["variant"]):
            raise FailedPrecondition(
                "CHANGE_NOT_SUPPORTED", f"bets at {table['variant']} tables are cancelled and placed again"
            )
        if amount_minor == 0:
            return await self._app._cancel(who, table_id, bet_id, cause="player")
        async with self._pool.connection() as conn:
            round_row = await self._app._round(conn, bet["round_id"])
            limits = ev.TableLimits.FromString(round_row["limits"])
            await self._app._check_stake(conn, round_row, player, amount_minor, limits, replacing=bet_id)
        config = EnvelopeTableConfig.from_settings(round_row["config"])
        new_hold = re_.hold_minor(amount_minor, config.rules)
        # One transaction, the round row shared then the bet row locked (the settlement's order):
        # changes and cancels of one bet take turns, and betting cannot close half-way.
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT phase, betting_closes_at FROM rounds WHERE round_id = %s FOR SHARE", (bet["round_id"],)
            )
            window = await cur.fetchone()
            if window is None or window[0] != Phase.BETTING or self._clock() >= window[1]:
                raise FailedPrecondition("BETTING_CLOSED", "a bet can be changed only during the betting window")
            async with conn.cursor(row_factory=dict_row) as dcur:
                await dcur.execute("SELECT * FROM bets WHERE bet_id = %s FOR UPDATE", (bet_id,))
                locked = await dcur.fetchone()
            assert locked is not None
            if locked["status"] != "placed":
                raise FailedPrecondition("BET_NOT_OPEN", f"bet {bet_id} is {locked['status']}")
            if await self._change(conn, command_id) is not None:
                raise FailedPrecondition("CHANGE_IN_PROGRESS", "this change is being applied; repeat it to see it")
            old_stake, old_hold = int(locked["stake_minor"]), int(locked["hold_minor"])
            if new_hold > old_hold:  # the wallet first: a refusal changes nothing
                await self._wallet.resize_hold(f"change.{command_id}", locked["hold_id"], new_hold)
            await conn.execute(
                "UPDATE bets SET stake_minor = %s, hold_minor = %s WHERE bet_id = %s",
                (amount_minor, new_hold, bet_id),
            )
            await conn.execute(
                "INSERT INTO bet_changes (change_id, bet_id, stake_minor, changed_at) VALUES (%s, %s, %s, %s)",
                (command_id, bet_id, amount_minor, self._clock()),
            )
            changed = ev.BetChanged(
                table_id=table_id,
                round_id=bet["round_id"],
                bet_id=bet_id,
                player=player,
                area=bet["area"],
                previous_stake_minor=old_stake,
                stake_minor=amount_minor,
                hold_minor=new_hold,
                hold_id=locked["hold_id"],
                change_id=command_id,
            )
            stream = bet_stream(table_id, bet_id)
            version = await self._store.stream_version(conn, stream)
            await self._store.append(
                conn,
                stream,
                version,
                [NewEvent("table.bet_changed", changed, correlation_id=bet["round_id"], causation_id=command_id)],
            )
        if new_hold < old_hold:
            # Releasing the difference after the commit; if this call is lost the settlement releases it.
            try:
                await self._wallet.resize_hold(f"change.{command_id}", locked["hold_id"], new_hold)
            except DomainError as error:
                log.warning("bet hold not reduced yet", extra={"bet_id": bet_id, "error": str(error)})
        self._app._notify_table(table_id)
        return BetReceipt(bet_id, bet["round_id"], bet["area"], amount_minor, new_hold, "placed", False)

    # ------------------------------------------------------------------ the envelope

    async def send(self, current: Mapping[str, Any]) -> None:
        """Betting closed: split the envelope among the dealer and the bettors, or void the round."""
        round_id, table_id = current["round_id"], current["table_id"]
        config = EnvelopeTableConfig.from_settings(current["config"])
        async with self._pool.connection() as conn:
            row = await self._envelope_row(conn, round_id)
            bets = [b for b in await self._app._round_bets(conn, round_id) if b["status"] == "placed"]
        if not bets:
            await self._app.void_round(table_id, round_id, "NO_BETS: nobody bet against the dealer")
            return
        participants = [row["dealer"], *(b["player"] for b in bets)]
        bet_ids = ["", *(b["bet_id"] for b in bets)]
        total = config.rules.envelope_total_minor
        shares: list[tuple[int, int]] | None = None
        for attempt in range(SPLIT_ATTEMPTS):
            try:
                amounts, order = await self._rng.split_envelope(
                    round_id, total, len(participants), MIN_SHARE_MINOR, current["client_seed"]
                )
                shares = assign_shares(amounts, order, len(participants))
                break
            except ValueError as error:
                log.error("envelope error", extra={"round_id": round_id, "error": str(error)})
                break
            except DomainError as error:
                log.warning("rng split failed", extra={"round_id": round_id, "attempt": attempt, "error": str(error)})
                if not isinstance(error, Unavailable):
                    break
                await asyncio.sleep(0.5)
        if shares is None:
            await self.void_for_redeal(table_id, round_id, "ENVELOPE_ERROR: the red envelope could not be sent")
            return
        interval = timedelta(milliseconds=ev.TableLimits.FromString(current["limits"]).reveal_interval_ms)
        async with self._pool.connection() as conn, conn.transaction():
            locked = await self._app._round(conn, round_id, lock=True)
            if locked["phase"] != Phase.DEALING:
                return
            async with conn.cursor() as cur:
                await cur.executemany(
                    "INSERT INTO envelope_grabs (round_id, grab_no, position, participant, bet_id, amount_minor)"
                    " VALUES (%s, %s, %s, %s, %s, %s)",
                    [
                        (round_id, k, position, participants[position], bet_ids[position] or None, amount)
                        for k, (position, amount) in enumerate(shares)
                    ],
                )
            await conn.execute(
                "UPDATE rounds SET phase = %s, next_step_at = %s WHERE round_id = %s",
                (Phase.REVEALING, self._clock() + interval, round_id),
            )
            sent = ev.EnvelopeSent(
                table_id=table_id,
                round_id=round_id,
                total_minor=total,
                shares=len(participants),
                min_minor=MIN_SHARE_MINOR,
                client_seed=current["client_seed"],
                participants=participants,
            )
            await self._app._append_table(conn, table_id, "table.envelope_sent", sent, correlation_id=round_id)
        self._app._notify_table(table_id)

    async def grab_next(self, current: Mapping[str, Any]) -> None:
        """Reveal the next grab; after the last one the round settles."""
        round_id, table_id = current["round_id"], current["table_id"]
        config = EnvelopeTableConfig.from_settings(current["config"])
        interval = timedelta(milliseconds=ev.TableLimits.FromString(current["limits"]).reveal_interval_ms)
        async with self._pool.connection() as conn, conn.transaction():
            locked = await self._app._round(conn, round_id, lock=True)
            if locked["phase"] != Phase.REVEALING:
                return
            grabs = await self._grabs(conn, round_id)
            done = locked["reveals_done"]
            if done >= len(grabs):
                return
            last = done + 1 == len(grabs)
            await conn.execute(
                "UPDATE rounds SET reveals_done = %s, phase = %s, next_step_at = %s WHERE round_id = %s",
                (done + 1, Phase.SETTLING if last else Phase.REVEALING, self._clock() + interval, round_id),
            )
            grabbed = grab_event(table_id, round_id, grabs[done], config)
            await self._app._append_table(conn, table_id, "table.envelope_grabbed", grabbed, correlation_id=round_id)
        self._app._notify_table(table_id)

    # ------------------------------------------------------------------ settlement

    async def settle(self, current: Mapping[str, Any]) -> None:
        round_id, table_id = current["round_id"], current["table_id"]
        config = EnvelopeTableConfig.from_settings(current["config"])
        started = self._clock()
        async with self._pool.connection() as conn, conn.transaction():
            locked = await self._app._round(conn, round_id, lock=True)
            if locked["phase"] != Phase.SETTLING:
                return
            row = await self._envelope_row(conn, round_id)
            grabs = await self._grabs(conn, round_id)
            dealer_amount = next(g.amount_minor for g in grabs if g.position == 0)
            if dealer_amount == re_.VOID_AMOUNT_MINOR:
                redeal = True
            else:
                redeal = False
                bets = await self._app._round_bets(conn, round_id)
                amounts = {g.bet_id: g.amount_minor for g in grabs if g.bet_id}
                live = [b for b in bets if b["status"] == "placed"]
                rnd = re_.EnvelopeRound(
                    dealer=row["dealer"],
                    dealer_pool_minor=int(row["dealer_pool_minor"]),
                    dealer_amount_minor=dealer_amount,
                    bets=tuple(
                        re_.EnvelopeBet(b["bet_id"], b["player"], int(b["stake_minor"]), amounts[b["bet_id"]])
                        for b in live
                    ),
                )
                settlement = re_.settle(rnd, config.rules)
                await self._app._save_outcomes(conn, settlement)
                settled = settlement_event(table_id, round_id, re_.VARIANT_ID, settlement, bets)
                funded = fund_dealer(
                    settled.transfers, row["dealer"], row["dealer_hold_id"], int(row["dealer_hold_minor"])
                )
                del settled.transfers[:]
                settled.transfers.extend(funded)
                settled.hold_ids.extend(await self._bid_holds(conn, round_id))
                await conn.execute(
                    "UPDATE rounds SET phase = %s, ended_at = %s WHERE round_id = %s",
                    (Phase.SETTLED, self._clock(), round_id),
                )
                await self._app._append_table(conn, table_id, "table.round_settled", settled, correlation_id=round_id)
        if redeal:
            await self.void_for_redeal(table_id, round_id, "DEALER_GRABBED_0.01: the round is re-dealt")
            return
        SETTLEMENT_SECONDS.labels(re_.VARIANT_ID).observe((self._clock() - started).total_seconds())
        ROUNDS.labels(re_.VARIANT_ID, Phase.SETTLED).inc()
        self._app._notify_table(table_id)

    async def void_for_redeal(self, table_id: str, round_id: str, reason: str) -> None:
        REDEALS.labels(reason.partition(":")[0]).inc()
        async with self._pool.connection() as conn:
            await conn.execute("UPDATE envelope_rounds SET redeal = true WHERE round_id = %s", (round_id,))
        await self._app.void_round(table_id, round_id, reason)

    async def fund_void(self, conn: psycopg.AsyncConnection, round_id: str, voided: ev.RoundVoided) -> None:
        """A voided red-envelope round releases every bid's hold with the bettors'."""
        voided.hold_ids.extend(await self._bid_holds(conn, round_id))

    # ------------------------------------------------------------------ reads

    async def bidding_closes_at(self, round_id: str) -> datetime | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute("SELECT bidding_closes_at FROM envelope_rounds WHERE round_id = %s", (round_id,))
            row = await cur.fetchone()
        return row[0] if row else None

    async def _bid_holds(self, conn: psycopg.AsyncConnection, round_id: str) -> list[str]:
        cur = await conn.execute(
            "SELECT hold_id FROM envelope_bids WHERE round_id = %s ORDER BY placed_at, bid_id", (round_id,)
        )
        return [str(r[0]) for r in await cur.fetchall()]

    async def _grabs(self, conn: psycopg.AsyncConnection, round_id: str) -> list[Grab]:
        cur = await conn.execute(
            "SELECT grab_no, position, participant, coalesce(bet_id, ''), amount_minor FROM envelope_grabs"
            " WHERE round_id = %s ORDER BY grab_no",
            (round_id,),
        )
        return [Grab(int(a), int(b), str(c), str(d), int(e)) for a, b, c, d, e in await cur.fetchall()]

    async def _envelope_table(self, conn: psycopg.AsyncConnection, table_id: str) -> dict[str, Any]:
        table = await self._app._table(conn, table_id)
        if not is_envelope(table["variant"]):
            raise FailedPrecondition("NO_BIDDING", f"table {table_id} ({table['variant']}) has no dealer bidding")
        return table

    async def _bidding_round(
        self, conn: psycopg.AsyncConnection, table: Mapping[str, Any], round_id: str
    ) -> dict[str, Any]:
        current = await self._app._round(conn, table["current_round_id"]) if table["current_round_id"] else None
        if current is None or current["phase"] != Phase.BIDDING:
            raise FailedPrecondition("BIDDING_CLOSED", "no round at this table is bidding for the dealer right now")
        if round_id and round_id != current["round_id"]:
            raise FailedPrecondition("ROUND_MISMATCH", f"round {round_id} is not the round bidding now")
        row = await self._envelope_row(conn, current["round_id"])
        if self._clock() >= row["bidding_closes_at"]:
            raise FailedPrecondition("BIDDING_CLOSED", "the bidding window has closed")
        return current

    async def _envelope_row(
        self, conn: psycopg.AsyncConnection, round_id: str, *, lock: bool = False
    ) -> dict[str, Any]:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                "SELECT * FROM envelope_rounds WHERE round_id = %s" + (" FOR UPDATE" if lock else ""), (round_id,)
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFound("ROUND_NOT_FOUND", f"no red-envelope round {round_id}")
        return row

    async def _bid(self, conn: psycopg.AsyncConnection, bid_id: str) -> dict[str, Any] | None:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                "SELECT b.*, r.table_id FROM envelope_bids b JOIN envelope_rounds r USING (round_id) WHERE bid_id = %s",
                (bid_id,),
            )
            return await cur.fetchone()

    async def _change(self, conn: psycopg.AsyncConnection, change_id: str) -> dict[str, Any] | None:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute("SELECT * FROM bet_changes WHERE change_id = %s", (change_id,))
            return await cur.fetchone()


def _replay_bid(existing: Mapping[str, Any], player: str, table_id: str, amount: int) -> BidReceipt:
    if (existing["player"], existing["table_id"], int(existing["amount_minor"])) != (player, table_id, amount):
        raise AlreadyExists("COMMAND_ID_REUSED", "this command id was used for a different bid")
    return BidReceipt(
        existing["bid_id"],
        existing["round_id"],
        int(existing["amount_minor"]),
        int(existing["hold_minor"]),
        existing["status"],
        True,
    )


def _bet_receipt(bet: Mapping[str, Any], *, replayed: bool) -> BetReceipt:
    return BetReceipt(
        bet["bet_id"],
        bet["round_id"],
        bet["area"],
        int(bet["stake_minor"]),
        int(bet["hold_minor"]),
        bet["status"],
        replayed,
    )


def _bid_too_low(needed: int, highest: int) -> FailedPrecondition:
    if highest:
        return FailedPrecondition("BID_TOO_LOW", f"the highest bid is {highest}: a new bid must be at least {needed}")
    return FailedPrecondition("BID_TOO_LOW", f"the first bid must be at least {needed}")
