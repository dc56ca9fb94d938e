"""The reference web table in headless Chromium on the real stack.

Two players log in on the page (clients/web, served by the browser gateway it calls),
bet with chips at a Golden Bull table (one of them also places and cancels a bet) and at a
68 NiuNiu table (a third player, through gRPC, bids for the dealer seat every round), see
the hands or envelope grabs revealed and the result, their balances updated, and the page
verifies the round from its revealed seed. Each page is saved as a screenshot in
.run/browser/<run>/. The page's figures are checked against the services.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from pathlib import Path

import grpc
import pytest
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from niuniu.wallet.v1 import wallet_pb2

from bull import fairness as fair
from bull.cards import parse_cards
from tests.clients.frontend_stack import (
    FUNDING_MINOR,
    ROOT,
    Stack,
    connect,
    create_table,
    funded_players,
    node_env,
)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NODE = shutil.which("node")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        NODE is None or not Path(CHROMIUM).exists(), reason="needs node and Debian's chromium (scripts/bootstrap)"
    ),
]

LIMITS = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=20_000,
    chips_minor=[100, 500, 1_000],
    betting_seconds=10,
    reveal_interval_ms=300,
    pause_between_rounds_ms=1_000,
)
ENVELOPE_CONFIG = {"bidding.seconds": "3", "fees.service_minor": "100"}
GOLDEN, ENVELOPE = "web-gb", "web-re"
# Per table: the chips, each player's area and where the first player also places and cancels a bet.
TABLES: list[dict[str, object]] = [
    {
        "tableId": GOLDEN,
        "variant": "golden_bull",
        "chips": [100, 500, 1_000],
        "areas": ["area_1", "area_2"],
        "cancelArea": "area_3",
    },
    {
        "tableId": ENVELOPE,
        "variant": "red_envelope_bull",
        "chips": [100, 500, 1_000],
        "areas": ["dealer", "dealer"],
        "cancelArea": None,
    },
]


async def bid_every_round(stack: Stack, table_id: str) -> None:
    """A third player takes the 68 NiuNiu dealer seat in every round (bids through gRPC)."""
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


async def test_two_players_at_the_web_table(stack: Stack, gateway: str, web_page: str) -> None:
    async with connect(stack) as c:
        await create_table(c, GOLDEN, "golden_bull", LIMITS)
        await create_table(c, ENVELOPE, "red_envelope_bull", LIMITS, ENVELOPE_CONFIG)
        players = await funded_players(c, ["web-alice", "web-bob"])
    bidder = asyncio.create_task(bid_every_round(stack, ENVELOPE))
    shots = ROOT / ".run" / "browser" / stack.run_id
    shots.mkdir(parents=True, exist_ok=True)
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
        proc = await asyncio.create_subprocess_exec(
            str(NODE),
            str(Path(__file__).with_name("two_players.mjs")),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=480)
    finally:
        bidder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await bidder
    print(err.decode()[-5000:])
    assert proc.returncode == 0, f"the browser run failed:\n{err.decode()[-3000:]}"
    report = json.loads(out.decode().strip().splitlines()[-1])
    print(json.dumps(report, indent=1))

    async with connect(stack) as c:
        for table in TABLES:
            table_id = str(table["tableId"])
            seen = report[table_id]
            round_id = seen["roundId"]
            for p in players:
                page = seen["players"][p.username]
                # The page verified the round from its revealed seed; so does the reference verifier.
                assert page["verifyStatus"] == "verified", page["verify"]
                assert page["verify"].startswith("verified")
                view = await c.table.GetRound(
                    table_pb2.GetRoundRequest(table_id=table_id, round_id=round_id), metadata=p.player.auth
                )
                assert reference_verifies(view), f"bull.fairness does not verify {round_id}"
                # Hands (Golden Bull) or envelope grabs (68 NiuNiu) revealed, in order.
                if table["variant"] == "golden_bull":
                    # Every seat's five cards as the round records them, in the stream's reveal order
                    # (the areas, then the dealer), the same on both pages.
                    cards = {h.seat: " ".join(h.cards) for h in view.hands}
                    shown = {h.split(":")[0]: h.split(": ")[1].split(" —")[0] for h in page["hands"]}
                    assert shown == cards, (page["hands"], cards)
                    assert [h.split(":")[0] for h in page["hands"]] == ["area_1", "area_2", "area_3", "dealer"]
                    assert page["hands"] == seen["players"][players[0].username]["hands"]
                else:
                    assert len(page["grabs"]) == 3, page["grabs"]  # the dealer and the two players
                    assert [g.split(":")[0] for g in page["grabs"]] == [f"grab {n}" for n in (1, 2, 3)]
                # The result and the new balance the page shows are the services'.
                assert page["status"] == "settled", page["result"]
                assert int(page["net"]) == sum(b.net_minor for b in view.my_bets), (page, view.my_bets)
                cancel_area = table["cancelArea"]
                staked = [b for b in view.my_bets if b.area != cancel_area]
                assert len(staked) == 1, view.my_bets  # one bet each at risk
                if cancel_area and p is players[0]:
                    # the first player's bet on the cancel area was cancelled on the page: it moved nothing
                    assert [b.net_minor for b in view.my_bets if b.area == cancel_area] == [0], view.my_bets
                if table_id == GOLDEN:  # the first round each player played: funding + its net
                    assert int(page["balance"]) == FUNDING_MINOR + int(page["net"])
                else:  # the last round: the wallet's balance now
                    balance = await c.wallet.GetBalance(wallet_pb2.GetBalanceRequest(), metadata=p.player.auth)
                    assert int(page["balance"]) == balance.available_minor
                    assert balance.held_minor == 0
                assert Path(page["screenshot"]).stat().st_size > 10_000
    print(f"screenshots in {os.path.relpath(shots, ROOT)}")


def reference_verifies(view: table_pb2.RoundView) -> bool:
    seed = bytes.fromhex(view.server_seed)
    if view.variant == "golden_bull":
        seats = {h.seat: list(h.cards) for h in view.hands}
        dealt = parse_cards([c for seat in ("dealer", "area_1", "area_2", "area_3") for c in seats[seat]])
        return fair.verify_round(view.commitment, seed, view.round_id, view.client_seed, 52, dealt).ok
    grabs = sorted(view.grabs, key=lambda g: g.grab_no)
    envelope = fair.EnvelopeRecord(
        view.envelope_total_minor,
        len(grabs),
        1,
        amounts=tuple(g.amount_minor for g in grabs),
        grab_order=tuple(g.position for g in grabs),
    )
    return fair.verify_round(view.commitment, seed, view.round_id, view.client_seed, envelope=envelope).ok
