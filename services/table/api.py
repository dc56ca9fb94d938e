"""The Table gRPC servicer: proto in, application call, proto out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2, table_pb2_grpc

from backbone.auth import Principal, Role, Tokens
from backbone.errors import DomainError, InvalidArgument, clip
from backbone.eventstore import EventStore
from bull.money import JACKPOT_POOL
from services.table.app import TableApp
from services.table.banker_api import BankerRpcs
from services.table.bets import BetOrder
from services.table.common import BetReceipt, player_account, unix_ms, variant_of
from services.table.core.view import round_view
from services.table.watch import Notifier, watch_table

Context = grpc.aio.ServicerContext[Any, Any]
MAX_ROUNDS_LISTED = 100


class TableServicer(BankerRpcs, table_pb2_grpc.TableServicer):
    def __init__(self, app: TableApp, store: EventStore, tokens: Tokens, notifier: Notifier | None) -> None:
        self._app = app
        self._store = store
        self._tokens = tokens
        self._notifier = notifier

    def _who(self, context: Context) -> Principal:
        return self._tokens.authenticate(context)

    async def CreateTable(self, request: table_pb2.CreateTableRequest, context: Context) -> table_pb2.TableInfo:
        await self._app.create_table(
            self._who(context), request.table_id, request.variant, dict(request.config), request.limits
        )
        return await self._info(request.table_id)

    async def UpdateConfig(self, request: table_pb2.UpdateConfigRequest, context: Context) -> table_pb2.TableInfo:
        await self._app.update_config(self._who(context), request.table_id, dict(request.config), request.limits)
        return await self._info(request.table_id)

    async def CloseTable(self, request: table_pb2.CloseTableRequest, context: Context) -> table_pb2.TableInfo:
        await self._app.close_table(self._who(context), request.table_id)
        return await self._info(request.table_id)

    async def GetTable(self, request: table_pb2.GetTableRequest, context: Context) -> table_pb2.TableInfo:
        self._who(context)
        return await self._info(request.table_id)

    async def ListTables(self, request: table_pb2.ListTablesRequest, context: Context) -> table_pb2.ListTablesResponse:
        self._who(context)
        return table_pb2.ListTablesResponse(tables=[await self._info(t) for t in await self._app.list_tables()])

    async def JoinTable(self, request: table_pb2.JoinTableRequest, context: Context) -> table_pb2.JoinTableResponse:
        await self._app.join(self._who(context), request.table_id)
        return table_pb2.JoinTableResponse(table=await self._info(request.table_id))

    async def LeaveTable(self, request: table_pb2.LeaveTableRequest, context: Context) -> table_pb2.LeaveTableResponse:
        refunded = await self._app.leave(self._who(context), request.table_id)
        return table_pb2.LeaveTableResponse(refunded_bet_ids=refunded)

    async def PlaceBet(self, request: table_pb2.PlaceBetRequest, context: Context) -> table_pb2.BetReceipt:
        receipt = await self._app.place_bet(
            self._who(context),
            request.command_id,
            request.table_id,
            request.area,
            request.amount_minor,
            request.round_id,
            request.client_seed,
        )
        return _receipt(receipt)

    async def PlaceBets(self, request: table_pb2.PlaceBetsRequest, context: Context) -> table_pb2.PlaceBetsResponse:
        orders = [
            BetOrder(b.command_id, b.table_id, b.area, b.amount_minor, b.round_id, b.client_seed) for b in request.bets
        ]
        outcomes = await self._app.place_bets(self._who(context), orders)
        return table_pb2.PlaceBetsResponse(outcomes=[_bet_outcome(o) for o in outcomes])

    async def CancelBet(self, request: table_pb2.CancelBetRequest, context: Context) -> table_pb2.BetReceipt:
        return _receipt(await self._app.cancel_bet(self._who(context), request.table_id, request.bet_id))

    async def ChangeBet(self, request: table_pb2.ChangeBetRequest, context: Context) -> table_pb2.BetReceipt:
        receipt = await self._app.envelope.change_bet(
            self._who(context), request.command_id, request.table_id, request.bet_id, request.amount_minor
        )
        return _receipt(receipt)

    async def PlaceBid(self, request: table_pb2.PlaceBidRequest, context: Context) -> table_pb2.BidReceipt:
        bid = await self._app.envelope.place_bid(
            self._who(context), request.command_id, request.table_id, request.amount_minor, request.round_id
        )
        return table_pb2.BidReceipt(
            bid_id=bid.bid_id,
            round_id=bid.round_id,
            amount_minor=bid.amount_minor,
            hold_minor=bid.hold_minor,
            status=bid.status,
            replayed=bid.replayed,
        )

    async def GetRound(self, request: table_pb2.GetRoundRequest, context: Context) -> table_pb2.RoundView:
        who = self._who(context)
        row = await self._app.round_row(request.round_id)
        if row["table_id"] != request.table_id:
            raise InvalidArgument(
                "ROUND_NOT_AT_TABLE", f"round {clip(request.round_id)} is not at table {clip(request.table_id)}"
            )
        (view,) = await self._round_views(who, request.table_id, [row])
        return view

    async def ListRounds(self, request: table_pb2.ListRoundsRequest, context: Context) -> table_pb2.ListRoundsResponse:
        who = self._who(context)
        limit = request.limit or 20
        if not 0 < limit <= MAX_ROUNDS_LISTED:
            raise InvalidArgument("LIMIT_INVALID", f"limit must be 1..{MAX_ROUNDS_LISTED}")
        await self._app.get_table(request.table_id)  # NOT_FOUND for a table that does not exist
        rows = await self._app.recent_rounds(request.table_id, limit)
        return table_pb2.ListRoundsResponse(rounds=await self._round_views(who, request.table_id, rows))

    async def WatchTable(
        self, request: table_pb2.WatchTableRequest, context: Context
    ) -> AsyncIterator[table_pb2.TableUpdate]:
        who = self._who(context)
        table, _ = await self._app.get_table(request.table_id)  # NOT_FOUND before streaming starts
        # OUT_OF_RANGE for an unknown or expired position, before anything is sent (watch.py).
        async for update in watch_table(self._app.ctx, self._notifier, who, table, request.after_position):
            yield update

    async def GetJackpot(self, request: table_pb2.GetJackpotRequest, context: Context) -> table_pb2.Jackpot:
        self._who(context)
        stake = 0
        if request.table_id:
            table, _ = await self._app.get_table(request.table_id)
            variant = variant_of(table["variant"])
            fixed = [variant.fixed_stake_minor(area, variant.parse_config(table["config"])) for area in variant.areas]
            stakes = {f for f in fixed if f is not None}
            if not stakes:
                raise InvalidArgument("NO_JACKPOT", f"table {request.table_id} has no jackpot side bets")
            stake = max(stakes)
        pool = await self._app.jackpot.read(self._app.pool)
        return table_pb2.Jackpot(
            account=JACKPOT_POOL,
            balance_minor=pool.balance_minor,
            in_flight_payouts_minor=pool.in_flight_minor,
            payable_minor=pool.payable_minor,
            stake_minor=stake,
        )

    async def _info(self, table_id: str) -> table_pb2.TableInfo:
        table, current = await self._app.get_table(table_id)
        variant = variant_of(table["variant"])
        config = variant.parse_config(table["config"])
        multiplier = variant.hold_multiplier(config)
        bidding_closes = None
        if current is not None and current["phase"] == "bidding":
            bidding_closes = await self._app.bidding_closes_at(current["round_id"])
        return table_pb2.TableInfo(
            table_id=table_id,
            variant=table["variant"],
            config=table["config"],
            limits=ev.TableLimits.FromString(table["limits"]),
            config_version=table["config_version"],
            current_round_id=table["current_round_id"] or "",
            phase=current["phase"] if current else "",
            betting_closes_at_unix_ms=unix_ms(current["betting_closes_at"]) if current else 0,
            areas=variant.areas,
            hold_multiplier=str(multiplier) if multiplier.denominator == 1 else f"{float(multiplier):g}",
            bidding_closes_at_unix_ms=unix_ms(bidding_closes),
            status="closed" if table["closed_at"] else "closing" if table["closing_at"] else "open",
        )

    async def _round_views(
        self, who: Principal, table_id: str, rows: list[dict[str, Any]]
    ) -> list[table_pb2.RoundView]:
        """The rounds' views from the read model ``evolve`` folds (``services/table/core``): one read of their
        events for all of them."""
        table, _ = await self._app.get_table(table_id)
        privileged = who.role in (Role.ADMIN, Role.AUDITOR)
        states = await self._app.round_states(str(table["variant"]), rows)
        return [round_view(state, player_account(who), privileged=privileged) for state in states]


def _receipt(receipt: BetReceipt) -> table_pb2.BetReceipt:
    return table_pb2.BetReceipt(
        bet_id=receipt.bet_id,
        round_id=receipt.round_id,
        area=receipt.area,
        stake_minor=receipt.stake_minor,
        hold_minor=receipt.hold_minor,
        status=receipt.status,
        replayed=receipt.replayed,
        hold_id=receipt.hold_id,
        client_seed=receipt.client_seed,
    )


def _bet_outcome(outcome: BetReceipt | DomainError) -> table_pb2.PlaceBetOutcome:
    if isinstance(outcome, DomainError):
        code: int = outcome.code.value[0]
        refusal = table_pb2.Refusal(code=code, reason=outcome.reason, message=outcome.message)
        return table_pb2.PlaceBetOutcome(refused=refusal)
    return table_pb2.PlaceBetOutcome(placed=_receipt(outcome))
