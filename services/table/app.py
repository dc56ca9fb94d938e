"""The table application: tables, and the self-running round of each.

``TableApp`` composes the parts: the stores (all SQL), the bet commands
(``bets.py``, ``envelope_commands.py``), the banker seat (``banker.py``) and one
round state machine per round shape (``round_cards.py``, ``round_envelope.py``),
chosen by the table's Variant. ``step`` advances a table's round by at most one
step; everything it needs is read from the store, so a new ``TableApp`` (a
restarted process, or another replica) resumes any round where it was.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from google.protobuf.message import Message
from niuniu.table.v1 import events_pb2 as ev
from psycopg_pool import AsyncConnectionPool

from backbone.auth import Principal, Role, require
from backbone.errors import AlreadyExists, DomainError, InvalidArgument
from backbone.eventstore import ConcurrencyError, EventStore, StoredEvent
from backbone.lease import check_fence
from bull.variants import VARIANTS, RoundShape, Variant
from services.table.banker import BankerSeats
from services.table.bets import BetOrder, Bets
from services.table.common import (
    ROUNDS,
    TABLE_ID,
    BetReceipt,
    Phase,
    check_limits,
    counted_contributions,
    parse_config,
    table_stream,
    variant_of,
)
from services.table.context import TableContext, utc_now
from services.table.core.evolve import EVENT_TYPES, fold_round
from services.table.core.state import RoundState
from services.table.envelope_commands import EnvelopeCommands
from services.table.jackpot import JackpotPool
from services.table.ports import RngPort, WalletPort
from services.table.round_base import RoundMachine, limits_of
from services.table.round_cards import BankerSeatRound, HouseDealerRound
from services.table.round_envelope import BiddingDealerRound
from services.table.store import Row, TableStore

log = logging.getLogger(__name__)

SEED_REVEAL_PATIENCE = timedelta(seconds=30)
OVERDUE_REVEALS_PER_STEP = 3
CLOSE_ATTEMPTS = 5
CLOSE_RETRY_S = 0.05


class TableApp:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        events: EventStore,
        wallet: WalletPort,
        rng: RngPort,
        *,
        clock: Callable[[], datetime] = utc_now,
        notify: Callable[[str, bool], Any] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self.pool = pool
        self.store = TableStore(pool, events)
        self.ctx = TableContext(self.store, wallet, rng, clock, notify)
        if sleep is not None:
            self.ctx.sleep = sleep
        for variant_id in VARIANTS:  # series exist from the start, so the first round shows in rate()
            for outcome in Phase.ENDED:
                ROUNDS.labels(variant_id, outcome)
        self.banker = BankerSeats(self.ctx)
        self.machines: dict[RoundShape, RoundMachine] = {
            RoundShape.HOUSE_DEALER: HouseDealerRound(self.ctx),
            RoundShape.BANKER_SEAT: BankerSeatRound(self.ctx, self.banker),
            RoundShape.BIDDING_DEALER: BiddingDealerRound(self.ctx),
        }
        self.bets = Bets(self.ctx, self.machine_for)
        self.envelope = EnvelopeCommands(self.ctx, self.bets)
        self.jackpot = JackpotPool(wallet)

    def machine_for(self, variant: Variant[Any]) -> RoundMachine:
        return self.machines[variant.shape]

    # ------------------------------------------------------------------ tables

    async def create_table(
        self, who: Principal, table_id: str, variant_name: str, config: Mapping[str, str], limits: ev.TableLimits
    ) -> Row:
        require(who, Role.ADMIN)
        if not TABLE_ID.fullmatch(table_id):
            raise InvalidArgument("TABLE_ID_MALFORMED", "table_id must be 1-64 of a-z, 0-9 and '-'")
        variant = variant_of(variant_name)
        settings = parse_config(variant, config)
        checked = check_limits(variant, limits)
        async with self.store.transaction() as conn:
            if not await self.store.insert_table(
                conn, table_id, variant.variant_id, settings, checked.SerializeToString()
            ):
                existing = await self.store.table(conn, table_id)
                if existing["variant"] != variant.variant_id or existing["config"] != settings:
                    raise AlreadyExists("TABLE_EXISTS", f"table {table_id} exists with another variant or config")
                return existing
            created = ev.TableCreated(
                table_id=table_id,
                variant=variant.variant_id,
                config=settings,
                limits=checked,
                config_version=1,
                created_by=who.subject,
            )
            await self.store.append(conn, table_stream(table_id), "table.created", created, correlation_id=table_id)
            return await self.store.table(conn, table_id)

    async def update_config(
        self, who: Principal, table_id: str, config: Mapping[str, str], limits: ev.TableLimits
    ) -> Row:
        require(who, Role.ADMIN)
        async with self.store.transaction() as conn:
            table = await self.store.table(conn, table_id, lock=True)
            variant = variant_of(table["variant"])
            settings = parse_config(variant, config)
            checked = check_limits(variant, limits)
            version = table["config_version"] + 1
            await self.store.update_config(conn, table_id, settings, checked.SerializeToString(), version)
            changed = ev.ConfigChanged(
                table_id=table_id, config=settings, limits=checked, config_version=version, changed_by=who.subject
            )
            await self.store.append(
                conn, table_stream(table_id), "table.config_changed", changed, correlation_id=table_id
            )
            return await self.store.table(conn, table_id)

    async def get_table(self, table_id: str) -> tuple[Row, Row | None]:
        async with self.store.read() as conn:
            table = await self.store.table(conn, table_id)
            return table, await self.store.current_round(conn, table)

    async def list_tables(self, *, open_only: bool = False) -> list[str]:
        """Every table's id; ``open_only``: those not closed (the ones with rounds to run)."""
        if not open_only:
            return await self.store.table_ids()
        async with self.store.read() as conn:
            cur = await conn.execute("SELECT table_id FROM tables WHERE closed_at IS NULL ORDER BY table_id")
            return [row[0] for row in await cur.fetchall()]

    async def close_table(self, who: Principal, table_id: str) -> Row:
        """Stop the table: bets are refused from now on, the round in play finishes, no round opens again.

        The table's owner (``step``) then ends it: once its last round has ended (every hold of
        it settled or released) the table is closed and its lease released. Idempotent.
        """
        require(who, Role.ADMIN)
        for attempt in range(1, CLOSE_ATTEMPTS + 1):
            try:
                table = await self._mark_closing(who, table_id)
                break
            except ConcurrencyError:
                # The round in play appended to the table's stream meanwhile (it orders its appends
                # by the round's lock, this by the table's): nothing was written; read and try again.
                if attempt == CLOSE_ATTEMPTS:
                    raise
                await self.ctx.sleep(CLOSE_RETRY_S * attempt)
        log.info("table closing", extra={"table_id": table_id, "by": who.subject})
        self.ctx.wake(table_id)
        return table

    async def _mark_closing(self, who: Principal, table_id: str) -> Row:
        async with self.store.transaction() as conn:
            table = await self.store.table(conn, table_id, lock=True)
            if table["closing_at"] is None:
                await conn.execute("UPDATE tables SET closing_at = %s WHERE table_id = %s", (self.ctx.now(), table_id))
                closing = ev.TableClosing(table_id=table_id, closed_by=who.subject)
                await self.store.append(conn, table_stream(table_id), "table.closing", closing, correlation_id=table_id)
                table = await self.store.table(conn, table_id)
        return table

    async def join(self, who: Principal, table_id: str) -> None:
        require(who, Role.PLAYER)
        async with self.store.read() as conn:
            await self.store.table(conn, table_id)
            await self.store.seat(conn, table_id, who.subject, self.ctx.now())

    async def leave(self, who: Principal, table_id: str) -> list[str]:
        """Leave the table: bets of a round still in its betting window are refunded."""
        require(who, Role.PLAYER)
        refunded = await self.bets.cancel_open(who, table_id)
        await self.banker.leave_table(who, table_id)  # a banker leaves once their round has settled
        return refunded

    # ------------------------------------------------------------------ bets (the servicer's entry points)

    async def place_bet(
        self,
        who: Principal,
        command_id: str,
        table_id: str,
        area: str,
        amount_minor: int,
        round_id: str = "",
        client_seed: str = "",
    ) -> BetReceipt:
        return await self.bets.place(who, command_id, table_id, area, amount_minor, round_id, client_seed)

    async def place_bets(self, who: Principal, orders: Sequence[BetOrder]) -> list[BetReceipt | DomainError]:
        return await self.bets.place_many(who, orders)

    async def cancel_bet(self, who: Principal, table_id: str, bet_id: str) -> BetReceipt:
        return await self.bets.cancel(who, table_id, bet_id)

    # ------------------------------------------------------------------ the round

    async def step(self, table_id: str, fencing_token: int = 0) -> float | None:
        """Advance the table's round by at most one step; returns seconds until the next step is due.

        None: the table is closed (nothing will ever be due again).
        """
        async with self.store.read() as conn:
            table = await self.store.table(conn, table_id)
            current = await self.store.current_round(conn, table)
        if table["closed_at"] is not None:
            return None
        machine = self.machine_for(variant_of(table["variant"]))
        if current is not None and current["phase"] not in Phase.ENDED:
            return await machine.step(table, current)
        now = self.ctx.now()
        if current is not None and current["server_seed"] is None:  # noqa: SIM102 (two different questions)
            if not await self.reveal_seed(current) and now < current["ended_at"] + SEED_REVEAL_PATIENCE:
                return 0.2
        await self._reveal_overdue_seeds(table_id, current)
        if table["closing_at"] is not None:
            await self._close(table_id, current)
            return None
        pause = timedelta(milliseconds=limits_of(table).pause_between_rounds_ms)
        if await machine.redeal_of(table):
            pause = timedelta(0)  # a re-deal follows its voided round at once
        if current is not None and now < current["ended_at"] + pause:
            return float((current["ended_at"] + pause - now).total_seconds())
        await machine.open(table, fencing_token)
        return 0.0

    async def _close(self, table_id: str, last: Row | None) -> None:
        """The closing table's last round has ended: the table is closed."""
        async with self.store.transaction() as conn:
            await check_fence(conn)
            table = await self.store.table(conn, table_id, lock=True)
            if table["closed_at"] is not None:
                return
            await conn.execute("UPDATE tables SET closed_at = %s WHERE table_id = %s", (self.ctx.now(), table_id))
            closed = ev.TableClosed(table_id=table_id, last_round_id=last["round_id"] if last else "")
            await self.store.append(conn, table_stream(table_id), "table.closed", closed, correlation_id=table_id)
        log.info("table closed", extra={"table_id": table_id})
        self.ctx.wake(table_id, stepped=True)

    async def void_round(self, table_id: str, round_id: str, reason: str) -> None:
        async with self.store.read() as conn:
            table = await self.store.table(conn, table_id)
        await self.machine_for(variant_of(table["variant"])).void_round(table_id, round_id, reason)

    async def _reveal_overdue_seeds(self, table_id: str, current: Row | None) -> None:
        """Keep asking for seeds the rng had not released in time (it closes rounds from Kafka).

        A round's seed must be revealed eventually for players to verify it; the table does
        not wait for it forever, so earlier rounds are retried here, a few per step.
        """
        skip = current["round_id"] if current else ""
        for row in await self.store.unrevealed_seeds(table_id, Phase.ENDED, skip, OVERDUE_REVEALS_PER_STEP):
            await self.reveal_seed(row)

    async def reveal_seed(self, current: Row) -> bool:
        round_id, table_id = current["round_id"], current["table_id"]
        try:
            seed = await self.ctx.rng.reveal(round_id)
        except DomainError:
            return False  # the rng has not seen the settlement yet; try again shortly
        async with self.store.transaction() as conn:
            await check_fence(conn)  # the runner's work (a superseded owner's reveal would be the same seed)
            locked = await self.store.round(conn, round_id, lock=True)
            if locked["server_seed"] is not None:
                return True
            await self.store.set_seed(conn, round_id, seed.server_seed)
            # The client seed the round was played with, as the table recorded it when it dealt
            # (GetRound shows the same): the rng's reveal answers the deck's, which a red-envelope
            # round, split and never drawn, does not have. And the contributions it combines, so a
            # player watching can check theirs counted.
            bets = await self.store.round_bets(conn, round_id)
            revealed = ev.SeedRevealed(
                table_id=table_id,
                round_id=round_id,
                server_seed=seed.server_seed,
                commitment=seed.commitment,
                client_seed=locked["client_seed"],
                client_seeds=counted_contributions(bets, locked["client_seed"]),
            )
            await self.store.append(
                conn, table_stream(table_id), "table.seed_revealed", revealed, correlation_id=round_id
            )
        self.ctx.wake(table_id, stepped=True)
        return True

    # ------------------------------------------------------------------ reads

    async def round_bets(self, round_id: str) -> list[Row]:
        async with self.store.read() as conn:
            return await self.store.round_bets(conn, round_id)

    async def round_row(self, round_id: str) -> Row:
        async with self.store.read() as conn:
            return await self.store.round(conn, round_id)

    async def recent_rounds(self, table_id: str, limit: int) -> list[Row]:
        return await self.store.recent_rounds(table_id, limit)

    async def bidding_closes_at(self, round_id: str) -> datetime | None:
        return await self.ctx.envelopes.bidding_closes_at(round_id)

    async def round_states(self, variant: str, rows: Sequence[Row]) -> list[RoundState]:
        """The rounds of ``rows`` (a table's, of ``variant``) folded from their events, read at once."""
        async with self.store.read() as conn:
            events = await self.store.read_rounds_events(conn, [r["round_id"] for r in rows])
        by_round: dict[str, list[Message]] = {r["round_id"]: [] for r in rows}
        for event in events:
            kind = EVENT_TYPES.get(event.event_type)
            if kind is not None and event.envelope.correlation_id in by_round:
                by_round[event.envelope.correlation_id].append(event.unpack(kind()))
        return [fold_round(_round_start(variant, r), by_round[r["round_id"]]) for r in rows]

    async def round_events(self, round_id: str) -> list[StoredEvent]:
        async with self.store.read() as conn:
            return await self.store.read_correlated(conn, round_id)


def _round_start(variant: str, row: Row) -> RoundState:
    """A round as its row fixes it before its events: its table, variant, settings and limits."""
    config = tuple(sorted(row["config"].items()))
    return RoundState(row["table_id"], row["round_id"], variant, config, ev.TableLimits.FromString(row["limits"]))
