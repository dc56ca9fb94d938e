"""The red-envelope table's own commands: bidding for the dealer seat, and changing a bet.

A bid is at least ``bidding.min_minor`` and at least ``bidding.increment_minor``
above the highest bid. The wallet holds each bid plus the dealer's three fees
(hold ``bid.<bid id>.<attempt>``, one for each attempt) before the bid is recorded; the bid it beats has its
hold released at once. The bid is recorded under the ``envelope_rounds`` row's
lock, so of two racing bids only one can lead; a bid that lost the race has its
hold released and is refused.

``ChangeBet`` changes a bet's stake in the betting window (the wallet resizes the
hold first when it grows, after the commit when it shrinks, each time conditionally on
the amount it read: ``EnvelopeCommands._restake``) or, with 0, cancels it.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
from niuniu.table.v1 import events_pb2 as ev

from backbone.auth import Principal, Role, require
from backbone.errors import (
    AlreadyExists,
    DomainError,
    FailedPrecondition,
    InvalidArgument,
    Unavailable,
)
from bull.variants import RoundShape
from bull.variants.red_envelope_bull import MAX_BID_MINOR, EnvelopeTableConfig
from services.table.admission import window_open
from services.table.bets import Bets, check_command_id
from services.table.common import (
    BIDS,
    HOLD_GRACE,
    MAX_STAKE_MINOR,
    BetReceipt,
    Phase,
    bet_stream,
    player_account,
    scoped_id,
    table_stream,
    unix_ms,
    variant_of,
)
from services.table.context import TableContext
from services.table.round_base import check_not_closing, limits_of
from services.table.store import Row

log = logging.getLogger(__name__)

CHANGED_MEANWHILE = "the bet was changed meanwhile; repeat your change"


@dataclass(frozen=True, slots=True)
class BidReceipt:
    bid_id: str
    round_id: str
    amount_minor: int
    hold_minor: int
    status: str
    replayed: bool


class EnvelopeCommands:
    def __init__(self, ctx: TableContext, bets: Bets) -> None:
        self._ctx = ctx
        self._store = ctx.store
        self._envelopes = ctx.envelopes
        self._bets = bets

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
        check_command_id(command_id)
        if not 0 < amount_minor <= MAX_BID_MINOR:
            raise InvalidArgument("AMOUNT_INVALID", f"amount_minor must be positive (and at most {MAX_BID_MINOR})")
        player = player_account(who)
        bid_id = scoped_id(player, command_id)
        async with self._store.read() as conn:
            existing = await self._envelopes.bid(conn, bid_id)
            if existing is None:  # placed before command ids were per player: stored under the id as sent
                legacy = await self._envelopes.bid(conn, command_id)
                existing = legacy if legacy is not None and legacy["player"] == player else None
            if existing is not None:
                return replay_bid(existing, player, table_id, amount_minor)
            table = await self._store.table(conn, table_id)
            check_not_closing(table)
            if variant_of(table["variant"]).shape is not RoundShape.BIDDING_DEALER:
                raise FailedPrecondition("NO_BIDDING", f"table {table_id} ({table['variant']}) has no dealer bidding")
            current = await self._store.current_round(conn, table)
            if current is None or current["phase"] != Phase.BIDDING:
                raise FailedPrecondition("BIDDING_CLOSED", "no round at this table is bidding for the dealer right now")
            if round_id and round_id != current["round_id"]:
                raise FailedPrecondition("ROUND_MISMATCH", f"round {round_id} is not the round bidding now")
            row = await self._envelopes.row(conn, current["round_id"])
            if self._ctx.now() >= row["bidding_closes_at"]:
                raise FailedPrecondition("BIDDING_CLOSED", "the bidding window has closed")
            config = EnvelopeTableConfig.from_settings(current["config"])
            needed = config.next_bid_minor(int(row["highest_bid_minor"]))
            if amount_minor < needed:
                raise bid_too_low(needed, int(row["highest_bid_minor"]))
        bid = {
            "bid_id": bid_id,
            "round_id": current["round_id"],
            "player": player,
            "amount_minor": amount_minor,
            "hold_id": f"bid.{bid_id}.{secrets.token_hex(6)}",  # an attempt's own, as a bet's (attempt_hold_id)
            "hold_minor": config.bid_hold_minor(amount_minor),
        }
        expires = row["bidding_closes_at"] + timedelta(seconds=limits_of(current).betting_seconds) + HOLD_GRACE
        await self._hold_bid(bid, unix_ms(expires))
        try:
            receipt, outbid_hold = await self._record_bid(bid, table_id, config)
        except FailedPrecondition:
            await self._ctx.wallet.void_hold(bid["hold_id"])
            raise
        if receipt.replayed:  # the same command, sent twice at once, was recorded with the other call's hold
            await self._ctx.wallet.void_hold(bid["hold_id"])
            return receipt
        if outbid_hold:
            # Also listed in the round's settlement or void, so a lost call here is made good there.
            with contextlib.suppress(DomainError):
                await self._ctx.wallet.void_hold(outbid_hold)
        self._ctx.wake(table_id)
        return receipt

    async def _hold_bid(self, bid: dict[str, Any], expires_unix_ms: int) -> None:
        """The wallet holds the bid's worst case under this attempt's own hold id (released if the call
        timed out after the wallet may have placed it)."""
        try:
            await self._ctx.wallet.place_hold(
                bid["hold_id"], bid["player"], bid["hold_minor"], "dealer bid", bid["round_id"], expires_unix_ms
            )
        except Unavailable:
            with contextlib.suppress(DomainError):
                await self._ctx.wallet.void_hold(bid["hold_id"])
            raise

    async def _record_bid(
        self, bid: Mapping[str, Any], table_id: str, config: EnvelopeTableConfig
    ) -> tuple[BidReceipt, str]:
        """Record the bid under the round's envelope row lock; (receipt, hold of the bid it beat)."""
        round_id = bid["round_id"]
        async with self._store.transaction() as conn:
            window = await self._store.window(conn, round_id)
            row = await self._envelopes.row(conn, round_id, lock=True)
            if window is None or window[0] != Phase.BIDDING or self._ctx.now() >= row["bidding_closes_at"]:
                raise FailedPrecondition("BIDDING_CLOSED", "bidding closed before the bid could be recorded")
            existing = await self._envelopes.bid(conn, bid["bid_id"])
            if existing is not None:  # the same command raced itself: the first one won
                return replay_bid(existing, bid["player"], table_id, bid["amount_minor"]), ""
            highest = int(row["highest_bid_minor"])
            needed = config.next_bid_minor(highest)
            if bid["amount_minor"] < needed:
                raise bid_too_low(needed, highest)
            outbid_id = row["leading_bid_id"] or ""
            outbid_hold = await self._envelopes.outbid(conn, outbid_id) if outbid_id else ""
            await self._envelopes.lead(conn, bid, self._ctx.now())
            placed = ev.BidPlaced(table_id=table_id, outbid_bid_id=outbid_id, **bid)
            await self._store.append(conn, table_stream(table_id), "table.bid_placed", placed, correlation_id=round_id)
        receipt = BidReceipt(bid["bid_id"], round_id, bid["amount_minor"], bid["hold_minor"], "leading", False)
        return receipt, outbid_hold

    # ------------------------------------------------------------------ changing a bet

    async def change_bet(
        self, who: Principal, command_id: str, table_id: str, bet_id: str, amount_minor: int
    ) -> BetReceipt:
        """Change a bet's stake in the betting window (0 cancels it)."""
        require(who, Role.PLAYER)
        check_command_id(command_id)
        if not 0 <= amount_minor <= MAX_STAKE_MINOR:
            raise InvalidArgument("AMOUNT_INVALID", "amount_minor must be 0 (cancel) or positive, at most 10^13")
        player = player_account(who)
        change_id = scoped_id(player, command_id)  # the change's id, per player like every command id
        async with self._store.read() as conn:
            done = await self._store.change(conn, change_id)
            bet = await self._bets.own_bet_at(conn, player, table_id, bet_id)
            if done is not None:
                if (done["bet_id"], int(done["stake_minor"])) != (bet["bet_id"], amount_minor):
                    raise AlreadyExists("COMMAND_ID_REUSED", "this command id was used for a different change")
                return BetReceipt.of(bet, replayed=True)
            table = await self._store.table(conn, table_id)
        variant = variant_of(table["variant"])
        if variant.shape is not RoundShape.BIDDING_DEALER:
            raise FailedPrecondition(
                "CHANGE_NOT_SUPPORTED", f"bets at {table['variant']} tables are cancelled and placed again"
            )
        if amount_minor == 0:
            return await self._bets.cancel(who, table_id, bet["bet_id"])
        async with self._store.read() as conn:
            round_row = await self._store.round(conn, bet["round_id"])
            await self._bets.check_stake(conn, round_row, player, amount_minor, replacing=bet["bet_id"])
        new_hold = variant.hold_minor(amount_minor, variant.parse_config(round_row["config"]))
        await self._restake(Change(bet, change_id, amount_minor, new_hold))
        self._ctx.wake(table_id)
        return BetReceipt.of({**bet, "stake_minor": amount_minor, "hold_minor": new_hold}, replayed=False)

    async def _restake(self, change: Change) -> None:
        """Change the bet's stake, and its hold with it, so that the wallet never holds less than the
        table's record of the bet needs, whatever other change or cancel of the bet runs meanwhile.

        The bet is read, then every wallet call names the amount it expects the hold to hold
        (a conditional resize, ``HOLD_CHANGED`` otherwise) under an id of this attempt's own. A bigger
        hold is asked first, outside any transaction (no remote call while a row is locked); then one
        transaction records the change only if the bet is still as it was read. If that transaction
        refuses, the hold goes back to what it was (the change leaves no trace in the wallet). A smaller
        hold is asked after the commit: until then, and if that call is lost or finds the hold changed,
        the wallet holds more than the bet needs, never less, and the settlement releases the rest.
        Of two changes made from one reading, at most one passes the wallet, and at most one the table.
        """
        bet_id = change.bet["bet_id"]
        async with self._store.read() as conn:
            read = await self._store.bet(conn, bet_id)
        assert read is not None
        if read["status"] != "placed":
            raise FailedPrecondition("BET_NOT_OPEN", f"bet {bet_id} is {read['status']}")
        old_hold, hold_id = int(read["hold_minor"]), read["hold_id"]
        attempt = f"{change.change_id}.{secrets.token_hex(6)}"
        grows = change.new_hold > old_hold
        if grows:  # the wallet first: a refusal changes nothing
            await self._resize(f"change.{attempt}", hold_id, change.new_hold, old_hold)
        try:
            await self._record_change(change, read)
        except (DomainError, *ROLLED_BACK):
            if grows:  # the change was not recorded: the hold goes back to what the bet needs
                await self._resize(f"undo.{attempt}", hold_id, old_hold, change.new_hold, quiet=True)
            raise
        if change.new_hold < old_hold:
            await self._resize(f"change.{attempt}", hold_id, change.new_hold, old_hold, quiet=True)

    async def _resize(self, resize_id: str, hold_id: str, amount: int, expected: int, *, quiet: bool = False) -> None:
        """A conditional resize; ``HOLD_CHANGED`` is the table's ``CHANGE_CONFLICT``. ``quiet``: a refusal
        only leaves the wallet holding more than the bet needs, so it is logged, not raised."""
        try:
            await self._ctx.wallet.resize_hold(resize_id, hold_id, amount, expected)
        except DomainError as error:
            if quiet:
                log.warning("bet hold not resized", extra={"hold_id": hold_id, "error": str(error)})
                return
            if error.reason == "HOLD_CHANGED":
                raise FailedPrecondition(
                    "CHANGE_CONFLICT", "the bet was changed meanwhile; repeat your change"
                ) from None
            raise

    async def _record_change(self, change: Change, read: Row) -> None:
        """The change and its event, if the bet is still as ``read``: under the round's row, the table's
        ordering lock and then the bet's row, the order a bet's recording and a cancel take them in."""
        bet = change.bet
        bet_id, table_id = bet["bet_id"], bet["table_id"]
        async with self._store.transaction() as conn:
            await self._store.lock_for_recording(conn, [bet["round_id"]], bet_stream(table_id, bet_id))
            if not window_open(await self._store.window(conn, bet["round_id"]), self._ctx.now()):
                raise FailedPrecondition("BETTING_CLOSED", "a bet can be changed only during the betting window")
            locked = await self._store.bet(conn, bet_id, lock=True)
            assert locked is not None
            if locked["status"] != "placed":
                raise FailedPrecondition("BET_NOT_OPEN", f"bet {bet_id} is {locked['status']}")
            if await self._store.change(conn, change.change_id) is not None:
                raise FailedPrecondition("CHANGE_IN_PROGRESS", "this change is being applied; repeat it to see it")
            if (locked["stake_minor"], locked["hold_minor"]) != (read["stake_minor"], read["hold_minor"]):
                raise FailedPrecondition("CHANGE_CONFLICT", CHANGED_MEANWHILE)
            await self._store.restake(conn, bet_id, change.amount_minor, change.new_hold)
            await self._store.insert_change(conn, change.change_id, bet_id, change.amount_minor, self._ctx.now())
            changed = ev.BetChanged(
                table_id=table_id,
                round_id=bet["round_id"],
                bet_id=bet_id,
                player=bet["player"],
                area=bet["area"],
                previous_stake_minor=int(read["stake_minor"]),
                stake_minor=change.amount_minor,
                hold_minor=change.new_hold,
                hold_id=locked["hold_id"],
                change_id=change.change_id,
            )
            await self._store.append(
                conn,
                bet_stream(table_id, bet_id),
                "table.bet_changed",
                changed,
                correlation_id=bet["round_id"],
                causation_id=change.change_id,
            )


@dataclass(frozen=True, slots=True)
class Change:
    """A bet's new stake and the hold it needs, under the change's per-player id."""

    bet: Row
    change_id: str
    amount_minor: int
    new_hold: int


ROLLED_BACK = (
    psycopg.errors.LockNotAvailable,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.QueryCanceled,
    psycopg.errors.SerializationFailure,
)
"""Errors a statement of the change's transaction fails with: the transaction did not commit. (A broken
connection is not among them: the COMMIT may have gone through, so the hold is left as it is.)"""


def replay_bid(existing: Mapping[str, Any], player: str, table_id: str, amount: int) -> BidReceipt:
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


def bid_too_low(needed: int, highest: int) -> FailedPrecondition:
    if highest:
        return FailedPrecondition("BID_TOO_LOW", f"the highest bid is {highest}: a new bid must be at least {needed}")
    return FailedPrecondition("BID_TOO_LOW", f"the first bid must be at least {needed}")
