"""What a watcher of a banked table may still bet (GAME_RULES §2 "可下注數"), from the round the watch folds."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, NamedTuple

from niuniu.table.v1 import table_pb2

from backbone.auth import Principal
from backbone.errors import DomainError
from bull.variants.baibian_bull import BaibianTableConfig
from services.table.banker import table_config
from services.table.common import player_account
from services.table.context import TableContext
from services.table.core.state import Phase, RoundState

OWN_MOVES = ("round_opened", "my_bet_placed", "my_bet_cancelled")
"""The updates after which the watcher's stakes and available balance are read again (their holds moved)."""


async def with_allowance(
    ctx: TableContext,
    updates: AsyncIterator[table_pb2.TableUpdate],
    who: Principal,
    table: Mapping[str, Any],
    round_in_play: Callable[[], RoundState | None],
) -> AsyncIterator[table_pb2.TableUpdate]:
    """``updates`` with the watcher's BetAllowance after each opening and each bet at a banked table.

    ``round_in_play`` answers the round the watch has folded up to the update last yielded (the
    watch folds an event before it yields that event's updates and is not advanced meanwhile). The
    table's stakes are those of the AreaTotals just sent, the view of that round.
    """
    player = player_account(who)
    config = table_config(table)
    mine = Stakes(0, 0, 0)
    async for update in updates:
        yield update
        kind = update.WhichOneof("update")
        state = round_in_play()
        if state is None:
            continue
        if kind in OWN_MOVES:
            mine = Stakes(*my_stakes(state, player), await _available_minor(ctx, player))
        if kind == "round_opened":
            yield allowance_update(update, state, player, mine, 0, config)
        elif kind == "area_totals" and state.phase == Phase.BETTING:
            table_staked = sum(update.area_totals.totals_minor.values())
            yield allowance_update(update, state, player, mine, table_staked, config)


class Stakes(NamedTuple):
    """A watcher's stakes and holds in the round in play, and their available balance."""

    staked_minor: int
    held_minor: int
    available_minor: int


def my_stakes(state: RoundState, player: str) -> tuple[int, int]:
    """(stakes, holds) of ``player``'s bets not cancelled in the round."""
    mine = [bet for bet in state.bets if bet.player == player and bet.status != "cancelled"]
    return sum(bet.stake_minor for bet in mine), sum(bet.hold_minor for bet in mine)


async def _available_minor(ctx: TableContext, player: str) -> int:
    try:
        return await ctx.wallet.balance_minor(player)
    except DomainError:
        return 0


def allowance_update(
    source: table_pb2.TableUpdate,
    state: RoundState,
    player: str,
    mine: Stakes,
    table_staked: int,
    config: BaibianTableConfig,
) -> table_pb2.TableUpdate:
    """``player``'s BetAllowance in ``state``, the table's stakes at ``table_staked``, at ``source``'s place."""
    capital = mine.available_minor + mine.held_minor
    banker_capital = state.dealer_hold_minor  # the banker's capital, held for the round
    my_cap = min(config.cap_minor(capital), config.cap_minor(banker_capital))
    open_ = bool(state.dealer) and state.dealer != player
    room = max(0, min(my_cap - mine.staked_minor, state.table_cap_minor - table_staked)) if open_ else 0
    chip = config.min_chip_minor
    allowance = table_pb2.BetAllowance(
        betting_open=open_,
        available_to_bet_minor=room // chip * chip,
        my_cap_minor=my_cap,
        my_staked_minor=mine.staked_minor,
        table_cap_minor=state.table_cap_minor,
        table_staked_minor=table_staked,
        player_capital_minor=capital,
        banker_capital_minor=banker_capital,
        banker=state.dealer,
    )
    return table_pb2.TableUpdate(
        position=source.position, table_id=source.table_id, round_id=source.round_id, bet_allowance=allowance
    )
