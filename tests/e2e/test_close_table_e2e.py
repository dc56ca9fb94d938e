"""CloseTable on the real system: the round in play finishes, then the table stops for good.

An admin closes a table while its round takes bets: the bets already placed are settled as
usual, a new bet is refused (FAILED_PRECONDITION TABLE_CLOSED), no round opens again, the
table's lease is released, every hold is resolved and no money is created or lost;
GetTable and ListTables say "closed". Only an admin may close a table.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from play import Watcher, connect, expect_refused, kind, settle_everything, total_money
from players import Clients, Player, all_balances, register
from redis.asyncio import Redis
from stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLOSE_WAIT_S = 60.0
LIMITS = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=5_000,
    chips_minor=[100],
    betting_seconds=3,
    reveal_interval_ms=50,
    pause_between_rounds_ms=100,
)


AREAS = {"golden_bull": ("area_1", "area_2"), "baibian_bull": ("heaven", "earth")}
CONFIGS = {"golden_bull": {}, "baibian_bull": {"banker.min_capital_minor": "10000"}}


def bet(table_id: str, round_id: str, command_id: str, area: str) -> table_pb2.PlaceBetRequest:
    return table_pb2.PlaceBetRequest(
        command_id=command_id, table_id=table_id, area=area, amount_minor=300, round_id=round_id
    )


async def table_status(c: Clients, table_id: str) -> table_pb2.TableInfo:
    return await c.table.GetTable(table_pb2.GetTableRequest(table_id=table_id), metadata=c.admin)


async def wait_closed(c: Clients, table_id: str) -> table_pb2.TableInfo:
    deadline = time.monotonic() + CLOSE_WAIT_S
    while (info := await table_status(c, table_id)).status != "closed":
        assert time.monotonic() < deadline, f"{table_id} still {info.status!r} after {CLOSE_WAIT_S}s"
        await asyncio.sleep(0.2)
    return info


@pytest.mark.parametrize("variant", ["golden_bull", "baibian_bull"])
async def test_close_finishes_the_round_then_stops_the_table_and_releases_everything(
    stack: Stack, variant: str
) -> None:
    table_id = f"close-{variant.replace('_', '-')}"
    async with connect(stack) as c:
        players: list[Player] = [await register(c, f"cl{variant[:2]}{i}x{stack.run_id}", 100_000) for i in range(3)]
        before = total_money(await all_balances(c))
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant=variant, config=CONFIGS[variant], limits=LIMITS),
            metadata=c.admin,
        )
        if variant == "baibian_bull":  # a banker seat holds the banker's capital for every round
            await c.table.ApplyBanker(
                table_pb2.ApplyBankerRequest(table_id=table_id, capital_minor=50_000), metadata=players[2].auth
            )
        watcher = Watcher(c, players[0], table_id)
        opened = await watcher.wait_for(
            lambda u: kind(u) == "round_opened" and (variant != "baibian_bull" or u.round_opened.banker != ""),
            timeout_s=60,
        )
        round_id = opened.round_id
        first_area, other_area = AREAS[variant]
        for p in players[:2]:
            await c.table.PlaceBet(bet(table_id, round_id, f"{round_id}.{p.name}", first_area), metadata=p.auth)

        await expect_refused(
            c.table.CloseTable(table_pb2.CloseTableRequest(table_id=table_id), metadata=players[0].auth),
            grpc.StatusCode.PERMISSION_DENIED,
            "",
        )
        await expect_refused(
            c.table.CloseTable(table_pb2.CloseTableRequest(table_id=f"{table_id}-nope"), metadata=c.admin),
            grpc.StatusCode.NOT_FOUND,
            "TABLE_NOT_FOUND",
        )
        closing = await c.table.CloseTable(table_pb2.CloseTableRequest(table_id=table_id), metadata=c.admin)
        assert closing.status in ("closing", "closed")
        # The round in play takes no new stakes...
        await expect_refused(
            c.table.PlaceBet(bet(table_id, round_id, f"{round_id}.late", other_area), metadata=players[1].auth),
            grpc.StatusCode.FAILED_PRECONDITION,
            "TABLE_CLOSED",
        )
        # ...but finishes: the bets placed before the close are settled.
        result = await watcher.wait_for(lambda u: kind(u) == "result" and u.round_id == round_id, timeout_s=60)
        assert result.result.status == "settled"
        assert len(result.result.my_bets) == 1

        closed = await wait_closed(c, table_id)
        assert closed.current_round_id == round_id
        listed = await c.table.ListTables(table_pb2.ListTablesRequest(), metadata=players[0].auth)
        assert {t.table_id: t.status for t in listed.tables}[table_id] == "closed"
        again = await c.table.CloseTable(table_pb2.CloseTableRequest(table_id=table_id), metadata=c.admin)
        assert again.status == "closed"  # idempotent

        # Stopped: no round opens again, bets are refused, the lease is free.
        await asyncio.sleep(3)
        assert not [u for u in watcher.updates if kind(u) == "round_opened" and u.round_id != round_id]
        assert (await table_status(c, table_id)).current_round_id == round_id
        await expect_refused(
            c.table.PlaceBet(bet(table_id, "", "after-close", first_area), metadata=players[0].auth),
            grpc.StatusCode.FAILED_PRECONDITION,
            "TABLE_CLOSED",
        )
        redis = Redis.from_url(stack.infra["REDIS_URL"])
        try:
            assert await redis.get(f"niuniu:lease:table:{stack.prefix}{table_id}") is None
        finally:
            await redis.aclose()

        # Everything it held is resolved; no money created or lost.
        await settle_everything(c, players)
        assert total_money(await all_balances(c)) == before
        await watcher.stop()
