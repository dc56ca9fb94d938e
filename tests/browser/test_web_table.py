"""The reference web table in headless Chromium on the real stack, every variant.

Two players log in on the page (clients/web, served by the browser gateway it calls): one in a
desktop window, one on a 390x844 phone reading Chinese. At a Golden Bull, a Bai Buu, a 百變牛牛
(a third player banks, through gRPC) and a 68 NiuNiu table (a fourth player bids for the dealer
seat every round, through gRPC) each bets one round from the page; the desktop player also
places and cancels a Golden Bull bet. From the page's DOM: the cards are drawn as images
(SVG), the risk the page showed before the bet is the hold the wallet took, the balance after
the result is the wallet's, the round is "verified" in the browser, and on the phone the result
and the verified mark are on screen without the test scrolling. A closed table is listed
without Play. Screenshots of every page are kept under the test's tmp dir (path printed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from pathlib import Path
from typing import Any

import grpc
import pytest
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from niuniu.wallet.v1 import wallet_pb2

from tests.clients.frontend_stack import FUNDING_MINOR, Stack, connect, create_table, funded_players, node_env

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NODE = shutil.which("node")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        NODE is None or not Path(CHROMIUM).exists(), reason="needs node and Debian's chromium (scripts/bootstrap)"
    ),
]


def limits(chips: list[int]) -> ev.TableLimits:
    return ev.TableLimits(
        min_bet_minor=100,
        max_bet_minor=20_000,
        chips_minor=chips,
        betting_seconds=10,
        reveal_interval_ms=300,
        pause_between_rounds_ms=1_000,
    )


# Per table: its variant and configuration, the chip both players bet, each player's area
# (desktop, phone), where the desktop player also places and cancels a bet, the card images
# the board shows (or envelope grabs) and a seat name the phone shows in Chinese.
TABLES: list[dict[str, Any]] = [
    {"tableId": "web-gb", "variant": "golden_bull", "chip": 500, "areas": ["area_1", "area_2"],
     "cancelArea": "area_3", "cards": 20, "zh": "莊家"},
    {"tableId": "web-bu", "variant": "bai_buu", "chip": 500, "areas": ["player_01", "banker_02"],
     "cancelArea": None, "cards": 16, "zh": "閒 01"},
    {"tableId": "web-bb", "variant": "baibian_bull", "chip": 1_000, "areas": ["heaven", "yellow"],
     "cancelArea": None, "cards": 25, "zh": "天", "config": {"banker.min_capital_minor": "100000"}},
    {"tableId": "web-re", "variant": "red_envelope_bull", "chip": 500, "areas": ["dealer", "dealer"],
     "cancelArea": None, "grabs": 3, "config": {"bidding.seconds": "3", "fees.service_minor": "100"}},
]  # fmt: skip
CLOSED = "web-closed"


async def bid_every_round(stack: Stack, table_id: str) -> None:
    """A player takes the 68 NiuNiu dealer seat in every round (bids through gRPC)."""
    async with connect(stack) as c:
        (dealer,) = await funded_players(c, ["web-dealer"])
        request = table_pb2.WatchTableRequest(table_id=table_id)
        while True:
            try:
                async for update in c.table.WatchTable(request, metadata=dealer.player.auth):
                    if update.WhichOneof("update") == "round_opened":
                        with contextlib.suppress(grpc.aio.AioRpcError):
                            await c.table.PlaceBid(
                                table_pb2.PlaceBidRequest(
                                    command_id=f"bid-{update.round_id}",
                                    table_id=table_id,
                                    amount_minor=10_000,
                                    round_id=update.round_id,
                                ),
                                metadata=dealer.player.auth,
                            )
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.5)


async def set_up_tables(stack: Stack) -> None:
    async with connect(stack) as c:
        for t in TABLES:
            await create_table(c, t["tableId"], t["variant"], limits([100, 500, 1_000]), t.get("config"))
        await create_table(c, CLOSED, "golden_bull", limits([100]))
        await c.table.CloseTable(table_pb2.CloseTableRequest(table_id=CLOSED), metadata=c.admin)
        (banker,) = await funded_players(c, ["web-banker"])
        await c.table.ApplyBanker(
            table_pb2.ApplyBankerRequest(table_id="web-bb", capital_minor=500_000), metadata=banker.player.auth
        )


async def run_pages(env: dict[str, str]) -> dict[str, Any]:
    script = Path(__file__).with_name("play_variants.mjs")
    proc = await asyncio.create_subprocess_exec(
        str(NODE), str(script), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=600)
    print(err.decode()[-5000:])
    assert proc.returncode == 0, f"the browser run failed:\n{err.decode()[-3000:]}"
    report: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return report


async def test_every_variant_at_the_web_table_on_desktop_and_phone(
    stack: Stack, gateway: str, web_page: str, tmp_path: Path
) -> None:
    await set_up_tables(stack)
    async with connect(stack) as c:
        players = await funded_players(c, ["web-alice", "web-bob"])
    bidder = asyncio.create_task(bid_every_round(stack, "web-re"))
    shots = tmp_path / "screenshots"
    shots.mkdir()
    env = node_env(
        {
            "NIUNIU_WEB_URL": web_page,
            "NIUNIU_WEB_PLAYERS": json.dumps([{"username": p.username, "password": p.password} for p in players]),
            "NIUNIU_WEB_TABLES": json.dumps(TABLES),
            "NIUNIU_WEB_SCREENSHOTS": str(shots),
            "CHROMIUM": CHROMIUM,
        }
    )
    try:
        report = await run_pages(env)
    finally:
        bidder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await bidder
    print(json.dumps(report, indent=1, ensure_ascii=False))
    print(f"screenshots in {shots}")

    listed = {t["tableId"]: t for t in report["tables"]}
    assert listed[CLOSED]["status"] == "closed" and not listed[CLOSED]["play"]
    assert all(listed[t["tableId"]]["play"] for t in TABLES)
    balances = {p.username: FUNDING_MINOR for p in players}
    async with connect(stack) as c:
        for table in TABLES:
            seen = report["rounds"][table["tableId"]]
            for p in players:
                page = seen["players"][p.username]
                view = await c.table.GetRound(
                    table_pb2.GetRoundRequest(table_id=table["tableId"], round_id=seen["roundId"]),
                    metadata=p.player.auth,
                )
                await check_page(c, table, page, view)
                balances[p.username] += int(page["net"])
                assert int(page["balance"]) == balances[p.username], (table["tableId"], page)
        for p in players:  # the last balance each page showed is the wallet's now
            balance = await c.wallet.GetBalance(wallet_pb2.GetBalanceRequest(), metadata=p.player.auth)
            assert (balance.available_minor, balance.held_minor) == (balances[p.username], 0)
    assert len(list(shots.glob("*.png"))) == 2 * len(TABLES)


async def check_page(c: Any, table: dict[str, Any], page: dict[str, Any], view: table_pb2.RoundView) -> None:
    """One player's page after one round, against the services."""
    assert page["verifyStatus"] == "verified", page["verify"]
    if "grabs" in table:
        assert page["grabs"] == table["grabs"] == len(view.grabs), page
    else:
        assert page["cardImages"] == table["cards"], page  # every card dealt, drawn as an image
    if page["device"] == "phone":
        assert page["resultView"]["inside"] and page["verifyView"]["inside"], page  # no scrolling needed
        if "zh" in table:
            assert table["zh"] in page["seats"], page["seats"]
    # The risk shown before the bet is what the wallet held for it.
    (bet,) = [b for b in view.my_bets if b.area == page["placed"]["area"] and b.outcome != "cancelled"]
    hold = await c.wallet.GetHold(wallet_pb2.GetHoldRequest(hold_id=bet.hold_id), metadata=c.admin)
    risk = int(page["riskBefore"]["risk"])
    assert risk == int(page["placed"]["riskShown"]) == int(page["placed"]["held"]) == hold.amount_minor, page
    assert int(page["riskBefore"]["stake"]) == bet.stake_minor == table["chip"]
    # The result is the services'.
    assert page["status"] == "settled" and int(page["net"]) == sum(b.net_minor for b in view.my_bets), page
    assert page["available"] == page["balance"]
