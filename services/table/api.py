"""The Table gRPC servicer: proto in, application call, proto out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import grpc
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2, table_pb2_grpc

from backbone.auth import Principal, Role, Tokens
from backbone.errors import DomainError, InvalidArgument, clip
from backbone.eventstore import EventStore, StoredEvent
from bull.money import JACKPOT_POOL
from services.table.app import TableApp
from services.table.banker_api import BankerRpcs
from services.table.bets import BetOrder
from services.table.common import BetReceipt, contribution_counted, player_account, unix_ms, variant_of
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
        return await self._round_view(who, row)

    async def ListRounds(self, request: table_pb2.ListRoundsRequest, context: Context) -> table_pb2.ListRoundsResponse:
        who = self._who(context)
        limit = request.limit or 20
        if not 0 < limit <= MAX_ROUNDS_LISTED:
            raise InvalidArgument("LIMIT_INVALID", f"limit must be 1..{MAX_ROUNDS_LISTED}")
        await self._app.get_table(request.table_id)  # NOT_FOUND for a table that does not exist
        rows = await self._app.recent_rounds(request.table_id, limit)
        return table_pb2.ListRoundsResponse(rounds=[await self._round_view(who, row) for row in rows])

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

    async def _round_view(self, who: Principal, row: dict[str, Any]) -> table_pb2.RoundView:
        events = await self._app.round_events(row["round_id"])
        hands = []
        settled = ev.RoundSettled()
        envelope = EnvelopeFacts()
        for event in events:
            if event.event_type == "table.hand_revealed":
                hand = ev.HandRevealed()
                event.unpack(hand)
                hands.append(hand)
            elif event.event_type == "table.round_settled":
                event.unpack(settled)
            else:
                envelope.fold(event)
        variant = await self._variant_of_table(row["table_id"])
        # Deal order, the order the cards left the deck (docs/api/frontend/stream.md, card-to-seat order).
        seats: tuple[str, ...] = tuple(getattr(variant_of(variant), "deal_order", ()))  # red envelope: no hands
        deal = {seat: n for n, seat in enumerate(seats)}
        hands.sort(key=lambda hand: deal.get(hand.seat, len(deal)))  # stable: parts stay in order
        bets = await self._app.round_bets(row["round_id"])
        totals = area_totals(bets)
        mine = bet_outcomes(who, bets, settled)
        return table_pb2.RoundView(
            table_id=row["table_id"],
            round_id=row["round_id"],
            round_no=row["round_no"],
            phase=row["phase"],
            commitment=row["commitment"],
            betting_closes_at_unix_ms=unix_ms(row["betting_closes_at"]),
            hands=hands,
            area_totals_minor=totals,
            my_bets=mine,
            server_seed=row["server_seed"] or "",
            client_seed=row["client_seed"] if row["server_seed"] else "",
            area_outcomes=settled.area_outcomes,
            area_odds=settled.area_odds,
            variant=variant,
            config=row["config"],
            dealer=envelope.dealer,
            dealer_pool_minor=envelope.pool_minor,
            highest_bid_minor=envelope.highest_bid_minor,
            grabs=envelope.grabs,
            envelope_total_minor=envelope.total_minor,
            redeal_of=envelope.redeal_of,
            void_reason=row["void_reason"] or "",
            client_seeds=contributions(who, row, bets),
            envelope_min_minor=envelope.min_minor,
        )

    async def _variant_of_table(self, table_id: str) -> str:
        table, _ = await self._app.get_table(table_id)
        return str(table["variant"])


class EnvelopeFacts:
    """A round's public facts beyond its hands, from its events: the banker or the dealer, and for red-envelope
    rounds the bids, the pool and the grabs revealed so far."""

    def __init__(self) -> None:
        self.dealer = ""
        self.pool_minor = 0
        self.highest_bid_minor = 0
        self.total_minor = 0
        self.min_minor = 0
        self.redeal_of = ""
        self.grabs: list[ev.EnvelopeGrabbed] = []

    def fold(self, event: StoredEvent) -> None:
        kind = event.event_type
        if kind == "table.round_opened":
            opened = ev.RoundOpened()
            event.unpack(opened)
            self.redeal_of = opened.redeal_of
            self.dealer = opened.banker  # 百變牛牛's banking player ("" elsewhere)
        elif kind == "table.bid_placed":
            bid = ev.BidPlaced()
            event.unpack(bid)
            self.highest_bid_minor = max(self.highest_bid_minor, bid.amount_minor)
        elif kind == "table.dealer_chosen":
            chosen = ev.DealerChosen()
            event.unpack(chosen)
            self.dealer, self.pool_minor = chosen.dealer, chosen.dealer_pool_minor
        elif kind == "table.envelope_sent":
            sent = ev.EnvelopeSent()
            event.unpack(sent)
            self.total_minor, self.min_minor = sent.total_minor, sent.min_minor
        elif kind == "table.envelope_grabbed":
            grab = ev.EnvelopeGrabbed()
            event.unpack(grab)
            self.grabs.append(grab)


def contributions(
    who: Principal, row: Mapping[str, Any], bets: Sequence[Mapping[str, Any]]
) -> list[table_pb2.ClientSeedContribution]:
    """The round's client seed contributions, bet by bet, once its seed is revealed (none before)."""
    if not row["server_seed"]:
        return []
    return [
        table_pb2.ClientSeedContribution(
            bet_id=b["bet_id"],
            client_seed=b["client_seed"],
            counted=contribution_counted(b, row["client_seed"]),
            mine=b["player"] == player_account(who),
        )
        for b in bets
        if b["client_seed"]
    ]


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


def area_totals(bets: list[dict[str, Any]]) -> dict[str, int]:
    """The stakes of a round's bets by area, cancelled bets left out."""
    totals: dict[str, int] = {}
    for bet in bets:
        if bet["status"] != "cancelled":
            totals[bet["area"]] = totals.get(bet["area"], 0) + bet["stake_minor"]
    return totals


def bet_outcomes(who: Principal, bets: list[dict[str, Any]], settled: ev.RoundSettled) -> list[ev.BetOutcome]:
    """The round's bets ``who`` may see (their own; every bet for an admin or auditor), with their outcomes."""
    privileged = who.role in (Role.ADMIN, Role.AUDITOR)
    return [
        ev.BetOutcome(
            bet_id=b["bet_id"],
            player=b["player"],
            area=b["area"],
            stake_minor=b["stake_minor"],
            outcome=b["outcome"] or b["status"],
            net_minor=b["net_minor"] or 0,
            hold_id=b["hold_id"],
            odds=settled.area_odds.get(b["area"], "") if b["status"] == "settled" else "",
        )
        for b in bets
        if privileged or b["player"] == player_account(who)
    ]
