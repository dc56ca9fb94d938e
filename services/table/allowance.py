"""What a watcher of a banked table may still bet (GAME_RULES §2 "可下注數"), folded from their updates."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from niuniu.table.v1 import table_pb2

from backbone.auth import Principal
from backbone.errors import DomainError
from bull.variants.baibian_bull import BaibianTableConfig
from services.table.banker import is_banked, table_config
from services.table.banker_store import RoundBanker
from services.table.common import player_account
from services.table.context import TableContext


class AllowanceFacts:
    """The rows and balances an allowance is computed from."""

    def __init__(self, ctx: TableContext) -> None:
        self._ctx = ctx

    async def of_round(self, round_id: str, player: str) -> tuple[RoundBanker | None, int, int, int]:
        """(round banker, table staked, player's staked, player's held), for a watcher resuming mid-round."""
        async with self._ctx.store.read() as conn:
            plan = await self._ctx.bankers.round_banker(conn, round_id)
            table_staked = await self._ctx.bankers.staked_minor(conn, round_id)
            my_staked, my_held = await self._ctx.store.player_totals(conn, round_id, player)
        return plan, table_staked, my_staked, my_held

    async def available_minor(self, player: str) -> int:
        try:
            return await self._ctx.wallet.balance_minor(player)
        except DomainError:
            return 0


async def with_allowance(
    ctx: TableContext, updates: AsyncIterator[table_pb2.TableUpdate], who: Principal, table: Mapping[str, Any]
) -> AsyncIterator[table_pb2.TableUpdate]:
    """``updates`` with the watcher's BetAllowance after each opening and each bet at a banked table."""
    banked = is_banked(table["variant"])
    allowance = Allowance(AllowanceFacts(ctx), player_account(who), table_config(table)) if banked else None
    async for update in updates:
        yield update
        if allowance is not None:
            extra = await allowance.fold(update)
            if extra is not None:
                yield extra


class Allowance:
    """Folds one watcher's updates into what they may still bet (GAME_RULES §2 "可下注數")."""

    def __init__(self, facts: AllowanceFacts, player: str, config: BaibianTableConfig) -> None:
        self._facts = facts
        self._player = player
        self._config = config
        self.round_id = ""
        self.banker = ""
        self.banker_capital = 0
        self.table_cap = 0
        self.table_staked = 0
        self.my_staked = 0
        self.my_held = 0
        self.available = 0
        self.betting = False
        self._mine: dict[str, tuple[int, int]] = {}

    async def fold(self, update: table_pb2.TableUpdate) -> table_pb2.TableUpdate | None:
        kind = update.WhichOneof("update")
        if kind == "round_opened":
            opened = update.round_opened
            self._start(update.round_id, opened.banker, opened.banker_capital_minor, opened.table_cap_minor)
            self.betting = True
            await self._refresh_capital()
            return self._update(update)
        if update.round_id and update.round_id != self.round_id:
            await self._resume(update.round_id)
        if kind == "my_bet_placed":
            placed = update.my_bet_placed
            self._mine[placed.bet_id] = (placed.stake_minor, placed.hold_minor)
            await self._refresh_capital()
        elif kind == "my_bet_cancelled":
            self._mine.pop(update.my_bet_cancelled.bet_id, None)
            await self._refresh_capital()
        elif kind == "area_totals":
            self.table_staked = sum(update.area_totals.totals_minor.values())
            return self._update(update) if self.betting else None
        elif kind == "phase_changed":
            self.betting = update.phase_changed.phase == "betting"  # the stream announces betting with its deadline
        return None

    def _start(self, round_id: str, banker: str, capital: int, cap: int) -> None:
        self.round_id, self.banker, self.banker_capital, self.table_cap = round_id, banker, capital, cap
        self.table_staked = 0
        self._mine.clear()

    async def _resume(self, round_id: str) -> None:
        """A watcher that resumed mid-round missed its opening: read the round's facts from the rows."""
        plan, table_staked, my_staked, my_held = await self._facts.of_round(round_id, self._player)
        banker = plan.banker if plan and plan.banker else ""
        self._start(round_id, banker, plan.capital_minor if plan else 0, plan.table_cap_minor if plan else 0)
        self.table_staked = table_staked
        self._mine["(earlier)"] = (my_staked, my_held)
        self.betting = True
        await self._refresh_capital()

    async def _refresh_capital(self) -> None:
        self.available = await self._facts.available_minor(self._player)

    def _update(self, source: table_pb2.TableUpdate) -> table_pb2.TableUpdate:
        my_staked = sum(stake for stake, _ in self._mine.values())
        my_held = sum(held for _, held in self._mine.values())
        capital = self.available + my_held
        my_cap = min(self._config.cap_minor(capital), self._config.cap_minor(self.banker_capital))
        open_ = bool(self.banker) and self.banker != self._player
        room = max(0, min(my_cap - my_staked, self.table_cap - self.table_staked)) if open_ else 0
        chip = self._config.min_chip_minor
        allowance = table_pb2.BetAllowance(
            betting_open=open_,
            available_to_bet_minor=room // chip * chip,
            my_cap_minor=my_cap,
            my_staked_minor=my_staked,
            table_cap_minor=self.table_cap,
            table_staked_minor=self.table_staked,
            player_capital_minor=capital,
            banker_capital_minor=self.banker_capital,
            banker=self.banker,
        )
        return table_pb2.TableUpdate(
            position=source.position, table_id=source.table_id, round_id=source.round_id, bet_allowance=allowance
        )
