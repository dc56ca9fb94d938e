"""The round as a state machine: what every round shape shares.

A round moves through phases (``Phase``); each shape (``round_cards.py``: the
house dealer and the banker seat; ``round_envelope.py``: the bidding dealer)
maps its phases to steps. ``step`` runs at most one step, as load -> decide ->
save (``decided``): it loads the round under its row lock, asks the pure core's
``decide`` (``services/table/core``) what the step's command does, and saves
exactly the events it returns with the rows they change in one transaction, so a
restarted or competing owner can never apply a step twice, and every deadline is
stored, so a restart resumes where the round was. What ``decide`` cannot do, the
machine does and hands it the answer: the rng's deal or split (``Deal``,
``Split``, ``RngFailed``), the wallet's hold check and the jackpot pool's balance
(``Settle``). The Variant (``bull.variants``) decides the game, ``decide`` when;
a machine decides only what to ask and what is stored.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf.message import Message
from niuniu.table.v1 import events_pb2 as ev

from backbone.errors import FailedPrecondition, Unavailable
from backbone.lease import check_fence
from bull.money import JACKPOT_POOL
from services.table import metrics
from services.table.common import ROUNDS, SETTLEMENT_SECONDS, Phase, table_stream, unix_ms, variant_of
from services.table.context import TableContext
from services.table.core import commands as cmd
from services.table.core.commands import Command
from services.table.core.decide import decide, voided
from services.table.core.evolve import EVENT_TYPES, Event, fold_round, with_bets
from services.table.core.settlement import funding_of, hands_of, live_bets
from services.table.core.state import Bet, RoundState, Sealed
from services.table.coverage import Need, covered_settlement
from services.table.jackpot import JackpotPool, PoolReading
from services.table.ports import WalletHold
from services.table.store import Conn, Row

Step = Callable[[Row, Row], Awaitable[float | None]]
"""A step of the round: None when it ran, or seconds to wait before trying it again (a call failed)."""

RNG_RETRY_S = 0.5
"""Seconds before a step tries the rng again. It is tried once per step (each call has its deadline,
``ports.CALL_TIMEOUT_S``), never in a loop inside a step, so a step stays well within the table's
lease, and the round deals as soon as the rng answers; ``decide`` voids it once it has waited
``RNG_PATIENCE_MS`` (``RngFailed``)."""
SETTLE_CHECK_PATIENCE = timedelta(seconds=20)
"""How long a round ready to settle waits for the wallet to answer its hold check (``settle``).

Past it the round settles as the table recorded it, unchecked (counted, logged): the wallet that
did not answer applies the settlement from Kafka later, and a settlement it then refuses goes to
the operator's repair path (docs/runbooks/NiuniuWalletSettlementRejected.md).
"""
WALLET_RETRY_S = 0.5
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
EVENT_NAMES = {kind: name for name, kind in EVENT_TYPES.items()}
"""The stored type of each wire event ``decide`` returns."""

log = logging.getLogger(__name__)


def settling_since(current: Mapping[str, Any]) -> datetime:
    """When the round became ready to settle: its last reveal's step time (the betting deadline at the latest)."""
    return current["next_step_at"] or current["betting_closes_at"]  # type: ignore[no-any-return]


@dataclass
class Opening:
    """What a shape fixes before its round opens: the first phase, deadlines, and its part of RoundOpened."""

    phase: str
    betting_closes_at: datetime
    stamp: Callable[[ev.RoundOpened], None] = lambda opened: None
    record: Callable[[Conn], Awaitable[None]] | None = None


def limits_of(row: Mapping[str, Any]) -> ev.TableLimits:
    return ev.TableLimits.FromString(row["limits"])


def check_not_closing(table: Mapping[str, Any]) -> None:
    """Refuse a bet or bid at a table an admin closed (CloseTable): its last round takes no new stakes."""
    if table.get("closing_at") is not None:
        raise FailedPrecondition("TABLE_CLOSED", f"table {table['table_id']} is closed")


class RoundMachine:
    """The phases every shape shares: opening, closing the betting window, settling, voiding."""

    def __init__(self, ctx: TableContext) -> None:
        self.ctx = ctx
        self.jackpot = JackpotPool(ctx.wallet)

    # ------------------------------------------------------------------ the machine

    def steps(self) -> dict[str, Step]:
        """Phase -> the step that leaves it; a shape adds its own phases."""
        return {Phase.BETTING: self.close_betting, Phase.SETTLING: self.settle}

    def deadline(self, current: Row) -> datetime | None:
        """When the round's current phase may be left (None: at once)."""
        if current["phase"] == Phase.BETTING:
            return current["betting_closes_at"]  # type: ignore[no-any-return]
        if current["phase"] == Phase.REVEALING:
            return current["next_step_at"]  # type: ignore[no-any-return]
        return None

    async def due(self, current: Row) -> datetime | None:
        return self.deadline(current)

    async def step(self, table: Row, current: Row) -> float:
        """Run the step the round's phase is waiting for, if it is due; seconds until the next one."""
        due = await self.due(current)
        now = self.ctx.now()
        if due is not None and now < due:
            return float((due - now).total_seconds())
        step = self.steps().get(current["phase"])
        if step is None:
            raise FailedPrecondition("ROUND_PHASE_UNKNOWN", f"round {current['round_id']} is {current['phase']}")
        retry = await step(table, current)
        return retry or 0.0

    # ------------------------------------------------------------------ hooks of the shapes

    async def prepare(self, table: Row, round_id: str) -> Opening:
        closes = self.ctx.now() + timedelta(seconds=limits_of(table).betting_seconds)
        return Opening(Phase.BETTING, closes)

    async def redeal_of(self, table: Row) -> str:
        """The round a new round re-deals ("" when it is not a re-deal)."""
        return ""

    async def check_bet(self, conn: Conn, config: Any, round_id: str, player: str, amount: int) -> None:
        """Refuse a bet the shape does not take (before the wallet holds it)."""

    async def reserve(self, conn: Conn, round_id: str, player: str, amount: int, hold_id: str) -> None:
        """In the bet's transaction: count it where the shape caps the stakes."""

    async def release(self, conn: Conn, round_id: str, amount: int) -> None:
        """A cancelled bet's stake no longer counts."""

    changes_bets = False
    checks_bets = False
    """The shape refuses some bets itself (``check_bet``), before the wallet holds them."""
    reserves_stakes = False
    """The shape counts stakes in the bet's own transaction (``reserve``), so a bet is recorded alone."""
    one_bet_per_round = False
    """A player has one open bet a round (changed, not added to): part of the admission (``verify_bet``)."""

    # ------------------------------------------------------------------ shared steps

    async def open(self, table: Row, fencing_token: int) -> None:
        table_id = table["table_id"]
        round_no = table["round_no"] + 1
        round_id = f"{table_id}-r{round_no}"
        variant = variant_of(table["variant"])
        commitment = await self.ctx.rng.commit(round_id, variant.commit_purpose)  # a retry gets the same one
        opening = await self.prepare(table, round_id)
        async with self.ctx.store.transaction() as conn:
            locked = await self.ctx.store.table(conn, table_id, lock=True)
            if locked["round_no"] != table["round_no"]:
                return  # another owner opened it first
            now = self.ctx.now()
            await self.ctx.store.insert_round(
                conn, locked, round_id, round_no, opening.phase, commitment, opening.betting_closes_at,
                fencing_token, now,
            )  # fmt: skip
            opened = ev.RoundOpened(
                table_id=table_id,
                round_id=round_id,
                round_no=round_no,
                commitment=commitment,
                betting_closes_at_unix_ms=unix_ms(opening.betting_closes_at),
                config_version=locked["config_version"],
                fencing_token=fencing_token,
            )
            opening.stamp(opened)
            if opening.record is not None:
                await opening.record(conn)
            await self.append(conn, table_id, "table.round_opened", opened, round_id)
        metrics.round_opened(locked, variant)
        self.ctx.wake(table_id, stepped=True)

    async def close_betting(self, table: Row, current: Row) -> None:
        await self.decided(table, current, cmd.Tick())

    # ------------------------------------------------------------------ load, decide, save

    async def decided(self, table: Row, current: Row, command: Command) -> list[Event]:
        """One step as ``decide`` answers it: the round loaded under its row lock, the events ``decide``
        returns for ``command`` now saved with the rows they change, in one transaction; then their
        effects (metrics, waking the table). None saved (an empty list): the round did not take it."""
        async with self.ctx.store.transaction() as conn:
            locked = await self.ctx.store.round(conn, current["round_id"], lock=True)
            state = await self.load(conn, table, locked)
            events = decide(state, command, unix_ms(self.ctx.now()))
            await self.save(conn, state, events)
        self.saved(state, events)
        return events

    async def load(self, conn: Conn, table: Row, current: Row) -> RoundState:
        """The round's state: folded from its events on the table's stream (``evolve``), with its bets as the
        store holds them (in its order; their events are on their own streams) and what the row keeps: the
        deck or the grabs (private), when the next reveal is due, and the betting deadline as ``step`` waits
        for it (the event's, to the millisecond)."""
        round_id = current["round_id"]
        start = RoundState(table["table_id"], round_id, table["variant"], tuple(sorted(current["config"].items())),
                           limits_of(current))  # fmt: skip
        stored = await self.ctx.store.read_round_events(conn, round_id, table_stream(table["table_id"]))
        state = fold_round(start, [e.unpack(kind()) for e in stored if (kind := EVENT_TYPES.get(e.event_type))])
        bets = [bet_of(b) for b in await self.ctx.store.round_bets(conn, round_id)]
        return replace(
            with_bets(state, bets),
            sealed=await self.sealed(conn, current),
            betting_closes_at_ms=unix_ms(current["betting_closes_at"]),
            next_step_at_ms=unix_ms(current["next_step_at"]),
        )

    async def sealed(self, conn: Conn, current: Row) -> Sealed:
        """What the round's row keeps private: its deck (a shape without one reads its own rows)."""
        return Sealed(deck=tuple(current["deck"] or ()))

    async def save(self, conn: Conn, state: RoundState, events: Sequence[Event]) -> None:
        """Write ``events``: the rows each changes (``save_rows``), then the event on the table's stream."""
        after = fold_round(state, events)
        for event in events:
            if isinstance(event, Message):
                await self.save_rows(conn, after, event)
                await self.append(conn, state.table_id, EVENT_NAMES[type(event)], event, state.round_id)

    async def save_rows(self, conn: Conn, after: RoundState, event: Message) -> None:
        """The rows ``event`` changes, as the round is once its events are folded (``after``)."""
        store, round_id = self.ctx.store, after.round_id
        if isinstance(event, ev.BettingClosed):
            await store.set_phase(conn, round_id, after.phase)
        elif isinstance(event, ev.Dealt | ev.EnvelopeSent):
            await store.set_client_seed(conn, round_id, after.client_seed)
            await store.dealt(conn, round_id, after.phase, after.sealed.deck or None, at_ms(after.next_step_at_ms))
        elif isinstance(event, ev.HandRevealed | ev.EnvelopeGrabbed):
            await store.revealed(conn, round_id, after.reveals_done, after.phase, at_ms(after.next_step_at_ms))
        elif isinstance(event, ev.RoundVoided):
            await store.refund_bets(conn, round_id)
            await store.end_round(conn, round_id, Phase.VOIDED, self.ctx.now(), event.reason)
        elif isinstance(event, ev.RoundSettled):
            await store.refund_bet_ids(conn, [b.bet_id for b in after.bets if b.status == "refunded"])
            await store.save_outcomes(conn, event.bets)
            await store.end_round(conn, round_id, Phase.SETTLED, self.ctx.now())

    def saved(self, state: RoundState, events: Sequence[Event]) -> None:
        """After the commit: count what ended, and wake the table for its next step."""
        if not events:
            return
        for event in events:
            if isinstance(event, ev.RoundVoided):
                ROUNDS.labels(state.variant, Phase.VOIDED).inc()
                metrics.round_ended(state.table_id, self.ctx.now())
        self.ctx.wake(state.table_id, stepped=True)

    # ------------------------------------------------------------------ settling

    async def settle(self, table: Row, current: Row) -> float | None:
        """Check the round's holds with the wallet, then settle (``_settle``); seconds to wait when the
        wallet did not answer and the round may still wait for it (``SETTLE_CHECK_PATIENCE``)."""
        try:
            holds: Mapping[str, WalletHold] | None = await self._read_holds(table, current)
        except Unavailable as error:
            if self.ctx.now() < settling_since(current) + SETTLE_CHECK_PATIENCE:
                return WALLET_RETRY_S
            log.warning("settling unchecked: the wallet did not answer", extra={"round_id": current["round_id"],
                                                                                "error": str(error)})  # fmt: skip
            metrics.SETTLEMENT_CHECKS.labels("unchecked").inc()
            holds = None
        # Paying from the jackpot pool needs the wallet, which is read before the transaction (jackpot.py).
        await self.jackpot.with_reading(
            self.ctx.store.pool, lambda reading: self._settle(table, current, reading, holds)
        )
        return None

    async def _read_holds(self, table: Row, current: Row) -> Mapping[str, WalletHold]:
        """The wallet's view of every hold the settlement may take from (read outside any transaction:
        betting has closed, so the bets and the dealer's hold are final)."""
        async with self.ctx.store.read() as conn:
            state = await self.load(conn, table, current)
        funding, _ = funding_of(state)
        hold_ids = [b.hold_id for b in state.placed]
        return await self.ctx.wallet.read_holds(hold_ids + [funding.dealer_hold_id] * bool(funding.dealer_hold_id))

    async def _settle(
        self, table: Row, current: Row, reading: PoolReading | None, holds: Mapping[str, WalletHold] | None
    ) -> None:
        """Settle as ``decide`` does (or void: the hands, or the dealer's hold, do not allow it). The wallet's
        hold check and the jackpot pool's payable balance are read here and given to it (``Settle``)."""
        started = self.ctx.now()
        async with self.ctx.store.transaction() as conn:
            locked = await self.ctx.store.round(conn, current["round_id"], lock=True)
            state = await self.load(conn, table, locked)
            events = decide(state, cmd.Settle(), unix_ms(started))
            if (unchecked := settled_in(events, None)) is not None:
                events = await self._settle_checked(conn, state, unchecked, reading, holds)
            await self.save(conn, state, events)
        self.saved(state, events)
        if (settled := settled_in(events, None)) is not None:
            variant = variant_of(state.variant)
            SETTLEMENT_SECONDS.labels(variant.variant_id).observe((self.ctx.now() - started).total_seconds())
            ROUNDS.labels(variant.variant_id, Phase.SETTLED).inc()
            config = variant.parse_config(state.settings)
            metrics.round_settled(state.table_id, variant, config, settled, self.ctx.now())

    async def _settle_checked(
        self,
        conn: Conn,
        state: RoundState,
        unchecked: ev.RoundSettled,
        reading: PoolReading | None,
        holds: Mapping[str, WalletHold] | None,
    ) -> list[Event]:
        """What ``decide`` settles once the wallet's holds are checked (``coverage.py``) and, when the round
        claims the jackpot pool (its unchecked settlement names the pool's balance), the pool is locked and
        read, with the claim recorded; or the void when the dealer's hold does not cover the round."""
        now, refunded = unix_ms(self.ctx.now()), frozenset[str]()
        if holds is not None:
            checked = self._check_coverage(state, holds)
            if isinstance(checked, str):
                return decide(state, cmd.Void(f"DEALER_HOLD_UNCOVERED: {checked}"), now)
            refunded = checked
        settled = settled_in(decide(state, cmd.Settle(refunded=refunded), now)) if refunded else unchecked
        if not settled.HasField("jackpot_pool_minor"):  # the round does not claim the pool
            return [settled]
        pool = await self.jackpot.lock_and_read(conn, reading)
        settled = settled_in(decide(state, cmd.Settle(pool.payable_minor, refunded), now))
        await self.jackpot.record_claim(conn, state.table_id, state.round_id, pool_delta(settled), pool)
        return [settled]

    def _check_coverage(self, state: RoundState, holds: Mapping[str, WalletHold]) -> frozenset[str] | str:
        """The live bets the wallet's holds do not cover (``coverage.py``), or why the dealer's hold does not
        cover the round. Counts and logs what it leaves out."""
        variant, round_id = variant_of(state.variant), state.round_id
        config, hands = variant.parse_config(state.settings), hands_of(state)
        funding, _ = funding_of(state)
        recorded = {b.hold_id: Need(b.player, b.hold_minor) for b in state.placed}
        live = live_bets(state)
        verdict = covered_settlement(
            lambda some: variant.settle(hands, some, config, funding), live, recorded, funding, holds, round_id
        )
        for bet_id, reason in verdict.refunded.items():
            metrics.BETS_REFUNDED_UNCOVERED.labels(reason).inc()
            log.error("bet refunded at settlement: the wallet's hold does not cover it",
                      extra={"round_id": round_id, "bet_id": bet_id, "reason": reason})  # fmt: skip
        if verdict.void_reason:
            metrics.SETTLEMENT_CHECKS.labels("voided").inc()
            log.error("round voided at settlement: the dealer's hold does not cover it",
                      extra={"round_id": round_id, "reason": verdict.void_reason})  # fmt: skip
            return verdict.void_reason
        metrics.SETTLEMENT_CHECKS.labels("refunded" if verdict.refunded else "covered").inc()
        return frozenset(b.bet_id for b in live if b not in verdict.live)

    async def void_round(self, table_id: str, round_id: str, reason: str) -> None:
        """End the round with every hold released and nothing else moved (``decide``'s ``Void``)."""
        async with self.ctx.store.read() as conn:
            table = await self.ctx.store.table(conn, table_id)
            current = await self.ctx.store.round(conn, round_id)
        await self.decided(table, current, cmd.Void(reason))
        self.ctx.wake(table_id)  # not the runner's step: it opens the next round sooner

    async def void_rejected(self, table_id: str, round_id: str, reason: str) -> ev.RoundVoided | None:
        """Void a settled round whose settlement the wallet refused: the operator's repair (``repair.py``).

        The RoundVoided lists every hold of the round, so the wallet, which accepts a void of a round
        whose settlement it rejected, releases them all; the round's bets become refunds. None when
        the round is voided already. Raises ConcurrencyError when the table's stream moved meanwhile
        (the caller tries again), FailedPrecondition ROUND_NOT_SETTLED for a round in any other phase.
        """
        async with self.ctx.store.transaction() as conn:
            locked = await self.ctx.store.round(conn, round_id, lock=True)
            if locked["table_id"] != table_id:
                raise FailedPrecondition("ROUND_NOT_AT_TABLE", f"round {round_id} is not table {table_id}'s")
            if locked["phase"] == Phase.VOIDED:
                return None
            if locked["phase"] != Phase.SETTLED:
                raise FailedPrecondition("ROUND_NOT_SETTLED", f"round {round_id} is {locked['phase']}, not settled")
            table = await self.ctx.store.table(conn, table_id)
            event = voided(await self.load(conn, table, locked), reason)
            await self.ctx.store.refund_settled_round(conn, round_id)
            await self.ctx.store.end_round(conn, round_id, Phase.VOIDED, self.ctx.now(), reason)
            await self.append(conn, table_id, "table.round_voided", event, round_id)
        self.ctx.wake(table_id)
        return event

    async def append(self, conn: Conn, table_id: str, event_type: str, payload: Any, round_id: str) -> None:
        """An event on the table's stream; the round (or table) row lock orders the appends.

        Every step of the round writes through here, so this is where the owner's fencing
        token is checked (``backbone.lease.check_fence``): a superseded owner's step is refused
        and rolled back.
        """
        await check_fence(conn)
        await self.ctx.store.append(conn, table_stream(table_id), event_type, payload, correlation_id=round_id)


def bet_of(row: Mapping[str, Any]) -> Bet:
    return Bet(row["bet_id"], row["player"], row["area"], int(row["stake_minor"]), int(row["hold_minor"]),
               row["hold_id"], row["client_seed"] or "", row["status"])  # fmt: skip


def at_ms(moment_ms: int) -> datetime:
    """A unix-ms instant as the rows store it."""
    return EPOCH + timedelta(milliseconds=moment_ms)


def settled_in(events: Sequence[Event], default: Any = NotImplemented) -> Any:
    """The RoundSettled among ``events`` (``default`` when there is none; without one, there must be)."""
    found = next((e for e in events if isinstance(e, ev.RoundSettled)), default)
    assert found is not NotImplemented, "decide settles a round it settled before"
    return found


def pool_delta(settled: ev.RoundSettled) -> int:
    """What the settlement moves into the jackpot pool (negative: it pays out of it)."""
    return sum(t.amount_minor for t in settled.transfers if t.payee == JACKPOT_POOL) - sum(
        t.amount_minor for t in settled.transfers if t.payer == JACKPOT_POOL
    )
