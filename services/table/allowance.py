"""What a watcher of a banked table may still bet (GAME_RULES §2 "可下注數"), from the round the watch folds."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from niuniu.table.v1 import table_pb2

from backbone.auth import Principal
from backbone.errors import DomainError
from bull.variants.baibian_bull import BaibianTableConfig
from services.table.banker import table_config
from services.table.common import player_account
from services.table.context import TableContext
from services.table.core.state import Phase, RoundState
from services.table.core.view import area_totals

BALANCE_READS = ("round_opened", "my_bet_placed", "my_bet_cancelled")
"""The updates after which the watcher's available balance is read again (their holds moved)."""


async def with_allowance(
    ctx: TableContext,
    updates: AsyncIterator[table_pb2.TableUpdate],
    who: Principal,
    table: Mapping[str, Any],
    round_in_play: Callable[[], RoundState | None],
) -> AsyncIterator[table_pb2.TableUpdate]:
    """``updates`` with the watcher's BetAllowance after each opening and each bet at a banked table.

    ``round_in_play`` answers the round the watch has folded up to the update last yielded (the
    watch folds an event before it yields that event's updates and is not advanced meanwhile).
    """
    player = player_account(who)
    config = table_config(table)
    available = 0
    async for update in updates:
        yield update
        kind = update.WhichOneof("update")
        if kind in BALANCE_READS:
            available = await _available_minor(ctx, player)
        state = round_in_play()
        if state is not None and (kind == "round_opened" or (kind == "area_totals" and state.phase == Phase.BETTING)):
            yield allowance_update(update, state, player, available, config)


async def _available_minor(ctx: TableContext, player: str) -> int:
    try:
        return await ctx.wallet.balance_minor(player)
    except DomainError:
        return 0


def allowance_update(
    source: table_pb2.TableUpdate, state: RoundState, player: str, available: int, config: BaibianTableConfig
) -> table_pb2.TableUpdate:
    """The BetAllowance of ``player`` (with ``available`` in the wallet) in ``state``, at ``source``'s place."""
    mine = [bet for bet in state.bets if bet.player == player and bet.status != "cancelled"]
    my_staked = sum(bet.stake_minor for bet in mine)
    capital = available + sum(bet.hold_minor for bet in mine)
    table_staked = sum(area_totals(state.bets).values())
    banker_capital = state.dealer_hold_minor  # the banker's capital, held for the round
    my_cap = min(config.cap_minor(capital), config.cap_minor(banker_capital))
    open_ = bool(state.dealer) and state.dealer != player
    room = max(0, min(my_cap - my_staked, state.table_cap_minor - table_staked)) if open_ else 0
    chip = config.min_chip_minor
    allowance = table_pb2.BetAllowance(
        betting_open=open_,
        available_to_bet_minor=room // chip * chip,
        my_cap_minor=my_cap,
        my_staked_minor=my_staked,
        table_cap_minor=state.table_cap_minor,
        table_staked_minor=table_staked,
        player_capital_minor=capital,
        banker_capital_minor=banker_capital,
        banker=state.dealer,
    )
    return table_pb2.TableUpdate(
        position=source.position, table_id=source.table_id, round_id=source.round_id, bet_allowance=allowance
    )
