"""A round the wallet would refuse, on the real system: the table's check, the alert's metric, the repair.

- A bet whose hold the wallet voided, and one whose hold it shrank (as a lost ChangeBet race
  leaves it), between betting and settlement: the table's check before it settles refunds those
  two bets and settles the rest, which the wallet applies (docs/settlement.md).
- A round the wallet refuses anyway (every hold shrunk, and the wallet down while the round
  settles, so it settles unchecked): the wallet records it rejected and its
  ``niuniu_wallet_settlements_rejected_total`` (NiuniuWalletSettlementRejected's metric)
  moves; the operator's repair (``python -m services.table.repair void-round``) voids the
  round at the table, the wallet releases every hold of it, and the balances are the
  deposits again.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence

import pytest
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from niuniu.wallet.v1 import wallet_pb2
from play import Watcher, connect, kind, settle_everything, total_money, update_is
from players import Clients, Player, all_balances, register
from prometheus_client.parser import text_string_to_metric_families
from stack import BIN, ROOT, Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEPOSIT = 100_000
WAIT_S = 90.0
LIMITS = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=5_000,
    chips_minor=[100],
    betting_seconds=2,
    reveal_interval_ms=1_500,  # time to reach the wallet between betting and settlement
    pause_between_rounds_ms=500,
)


def metric(stack: Stack, service: str, name: str, labels: dict[str, str]) -> float:
    """A sample of the service's /metrics (0 when the series does not exist)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics_ports[service]}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return float(sample.value)
    return 0.0


async def round_holds(c: Clients, player: Player, round_id: str) -> list[wallet_pb2.Hold]:
    page = await c.wallet.ListHolds(wallet_pb2.ListHoldsRequest(account=player.account), metadata=c.admin)
    return [h for h in page.holds if h.round_id == round_id]


async def shrink(c: Clients, hold: wallet_pb2.Hold) -> None:
    request = wallet_pb2.ResizeHoldRequest(resize_id=f"shrink.{hold.hold_id}", hold_id=hold.hold_id, amount_minor=1)
    await c.wallet.ResizeHold(request, metadata=c.admin)


async def wallet_status(c: Clients, round_id: str, wanted: str) -> wallet_pb2.RoundSettlement:
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            found = await c.wallet.GetRoundSettlement(
                wallet_pb2.GetRoundSettlementRequest(round_id=round_id), metadata=c.admin, timeout=2
            )
            if found.status == wanted:
                return found
        except Exception:
            pass
        assert time.monotonic() < deadline, f"the wallet never reported {round_id} {wanted}"
        await asyncio.sleep(0.2)


def revealing(round_id: str) -> Callable[[table_pb2.TableUpdate], bool]:
    """Betting has closed and the hands are being shown: the bets are final, the round not settled."""
    return lambda u: update_is("phase_changed", round_id)(u) and u.phase_changed.phase == "revealing"


async def place(c: Clients, table_id: str, round_id: str, bets: Sequence[tuple[Player, str]]) -> None:
    for p, area in bets:
        request = table_pb2.PlaceBetRequest(
            command_id=f"{round_id}.{p.name}.{area}", table_id=table_id, area=area, amount_minor=300, round_id=round_id
        )
        await c.table.PlaceBet(request, metadata=p.auth)


async def test_bets_whose_holds_the_wallet_lost_are_refunded_and_the_rest_settles(stack: Stack) -> None:
    table_id = "cover-gb"
    async with connect(stack) as c:
        players = [await register(c, f"cv{i}x{stack.run_id}", DEPOSIT) for i in range(3)]
        before = total_money(await all_balances(c))
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant="golden_bull", limits=LIMITS), metadata=c.admin
        )
        watcher = Watcher(c, players[0], table_id)
        round_id = (await watcher.wait_for(lambda u: kind(u) == "round_opened")).round_id
        await place(c, table_id, round_id, [(p, "area_1") for p in players])
        await watcher.wait_for(
            lambda u: update_is("phase_changed", round_id)(u) and u.phase_changed.phase == "revealing"
        )
        (voided,) = await round_holds(c, players[1], round_id)
        await c.wallet.VoidHold(wallet_pb2.VoidHoldRequest(hold_id=voided.hold_id), metadata=c.admin)
        (shrunk,) = await round_holds(c, players[2], round_id)
        await shrink(c, shrunk)
        not_open = metric(stack, "table", "niuniu_table_bets_refunded_uncovered_total", {"reason": "HOLD_NOT_OPEN"})

        result = await watcher.wait_for(update_is("result", round_id), timeout_s=WAIT_S)
        assert result.result.status == "settled" and len(result.result.my_bets) == 1
        await wallet_status(c, round_id, "settled")  # the rest of the round is applied, not refused
        for name, reason in (("HOLD_NOT_OPEN", not_open + 1), ("HOLD_INSUFFICIENT", 1.0)):
            labels = {"reason": name}
            assert metric(stack, "table", "niuniu_table_bets_refunded_uncovered_total", labels) >= reason
        await c.table.CloseTable(table_pb2.CloseTableRequest(table_id=table_id), metadata=c.admin)
        await settle_everything(c, players)
        balances = await all_balances(c)
        for refunded in players[1:]:  # their stakes were never taken
            assert balances[refunded.account] == (DEPOSIT, 0)
        assert total_money(balances) == before
        await watcher.stop()


async def test_a_round_the_wallet_refuses_is_counted_and_the_repair_releases_every_hold(stack: Stack) -> None:
    table_id = "repair-bb"
    async with connect(stack) as c:
        bettors = [await register(c, f"rp{i}x{stack.run_id}", DEPOSIT) for i in range(2)]
        banker = await register(c, f"rpbx{stack.run_id}", DEPOSIT)
        players = [*bettors, banker]
        before = total_money(await all_balances(c))
        config = {"banker.min_capital_minor": "10000"}
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant="baibian_bull", config=config, limits=LIMITS),
            metadata=c.admin,
        )
        await c.table.ApplyBanker(
            table_pb2.ApplyBankerRequest(table_id=table_id, capital_minor=50_000), metadata=banker.auth
        )
        watcher = Watcher(c, bettors[0], table_id)
        opened = await watcher.wait_for(lambda u: kind(u) == "round_opened" and u.round_opened.banker != "")
        round_id = opened.round_id
        await place(c, table_id, round_id, [(bettors[0], "heaven"), (bettors[0], "earth")])
        await place(c, table_id, round_id, [(bettors[1], "mystic"), (bettors[1], "yellow")])
        await watcher.wait_for(
            lambda u: update_is("phase_changed", round_id)(u) and u.phase_changed.phase == "revealing"
        )
        # Every hold shrunk: whoever wins, the settlement takes more from some hold than it holds
        # (two hands of one 百變 deal are never equal, so every bet is won or lost).
        holds = [h for p in players for h in await round_holds(c, p, round_id)]
        assert len(holds) == 5  # four bets and the banker's capital
        for hold in holds:
            await shrink(c, hold)
        # The wallet down while the round settles: the table waits, then settles unchecked.
        stack.kill("wallet")
        result = await watcher.wait_for(update_is("result", round_id), timeout_s=WAIT_S)
        assert result.result.status == "settled"
        await asyncio.to_thread(stack.start, "wallet")

        rejected = await wallet_status(c, round_id, "rejected")
        assert rejected.reason == "HOLD_INSUFFICIENT"
        labels = {"reason": "HOLD_INSUFFICIENT"}
        assert metric(stack, "wallet", "niuniu_wallet_settlements_rejected_total", labels) >= 1  # the alert's metric
        frozen = [await c.wallet.GetHold(wallet_pb2.GetHoldRequest(hold_id=h.hold_id), metadata=c.admin) for h in holds]
        assert all(h.status == wallet_pb2.HOLD_STATUS_OPEN for h in frozen)

        repair = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.table.repair", "void-round", round_id, "--wait-s", "60",
            env=stack.env("table") | {"PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT))},
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await repair.communicate()
        assert repair.returncode == 0, out.decode()
        assert (await wallet_status(c, round_id, "voided")).status == "voided"
        for hold in holds:
            got = await c.wallet.GetHold(wallet_pb2.GetHoldRequest(hold_id=hold.hold_id), metadata=c.admin)
            assert got.status == wallet_pb2.HOLD_STATUS_VOIDED, got
        view = await c.table.GetRound(table_pb2.GetRoundRequest(table_id=table_id, round_id=round_id), metadata=c.admin)
        assert view.phase == "voided"

        await c.table.CloseTable(table_pb2.CloseTableRequest(table_id=table_id), metadata=c.admin)
        await settle_everything(c, players)
        balances = await all_balances(c)
        assert all(balances[p.account] == (DEPOSIT, 0) for p in players), balances
        assert total_money(balances) == before
        await audit_replay_names_only(stack, "cover-gb-")
        await watcher.stop()


async def audit_replay_names_only(stack: Stack, forced: str) -> None:
    """``niuniu-audit replay`` over the module's stack: the splits the refund test forced on purpose (its
    rounds' ids start with ``forced``) are its only differences; the repaired round is not one of them."""
    argv = ["replay", "--schema", stack.schema_of("ledger"), "--topic-prefix", stack.prefix]
    argv += ["--wallet", stack.addr("wallet"), "--dsn", stack.infra["DATABASE_URL"], "--no-progress"]
    audit = await asyncio.create_subprocess_exec(
        str(BIN / "niuniu-audit"), *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    report = (await audit.communicate())[0].decode()
    named = [line for line in report.splitlines() if line.strip().startswith("[")]
    assert named and all(forced in line for line in named), report
