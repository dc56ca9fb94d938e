"""Golden Bull end to end: four service processes, real Kafka, PostgreSQL and Redis.

Three players registered through the wallet play 15 rounds (50 at full length) with random bets on all
areas; then every hold is resolved, the money adds up, the ledger balances, the
audit replay is clean and every round verifies from its revealed seed. The table
process is killed in each phase and restarted without losing or creating money,
and bad bets are refused with a clear status while changing nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
from collections.abc import Sequence

import grpc
import pytest
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from niuniu.wallet.v1 import wallet_pb2
from play import (
    EXTERNAL,
    Watcher,
    card_updates_are_reveals,
    connect,
    expect_refused,
    game_length,
    kind,
    ledger_matches_wallet,
    revealed_round,
    settle_everything,
    total_money,
)
from players import Clients, Player, all_balances, register
from stack import BIN, Stack

from tools import verify

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUNDS = game_length(ci=15, full=50)
DEPOSIT_MINOR = 1_000_000
FAST = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=5_000,
    chips_minor=[100],
    betting_seconds=1,
    reveal_interval_ms=10,
    pause_between_rounds_ms=50,
)


async def bet_randomly(c: Clients, players: Sequence[Player], table_id: str, round_id: str, rng: random.Random) -> int:
    """Up to three bets a player; the first player sends theirs in one PlaceBets call, the others one by one."""
    placed = 0
    for i, p in enumerate(players):
        requests = [
            table_pb2.PlaceBetRequest(
                command_id=f"{round_id}.{p.name}.{n}",
                table_id=table_id,
                area=rng.choice(["area_1", "area_2", "area_3"]),
                amount_minor=100 * rng.randint(1, 10),
                round_id=round_id,
            )
            for n in range(rng.randint(0, 3))
        ]
        if i == 0 and requests:
            answer = await c.table.PlaceBets(table_pb2.PlaceBetsRequest(bets=requests), metadata=p.auth)
            assert len(answer.outcomes) == len(requests)
            for request, outcome in zip(requests, answer.outcomes, strict=True):
                if outcome.WhichOneof("outcome") == "placed":
                    assert outcome.placed.area == request.area and outcome.placed.stake_minor == request.amount_minor
                    placed += 1
                else:  # only a closing window may refuse
                    assert outcome.refused.reason == "BETTING_CLOSED", outcome
            continue
        for request in requests:
            try:
                await c.table.PlaceBet(request, metadata=p.auth)
                placed += 1
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error  # only a closing window may refuse
                assert "BETTING_CLOSED" in (error.details() or "")
    return placed


async def verify_round(c: Clients, player: Player, table_id: str, round_id: str) -> None:
    view = await revealed_round(c, table_id, round_id, player.auth)
    hands = {h.seat: list(h.cards) for h in view.hands}
    dealt = " ".join(card for seat in ("dealer", "area_1", "area_2", "area_3") for card in hands[seat])
    argv = ["--commitment", view.commitment, "--seed", view.server_seed, "--round", round_id]
    argv += ["--client-seed", view.client_seed, "--deck", "52", "--dealt", dealt]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = verify.main(argv)
    assert code == 0, out.getvalue()


async def test_three_players_play_many_rounds_and_everything_reconciles(stack: Stack) -> None:
    rng = random.Random(20261129)
    table_id = "gb-main"
    async with connect(stack) as c:
        players = [await register(c, f"p{i}x{stack.run_id}", DEPOSIT_MINOR) for i in range(3)]
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant="golden_bull", limits=FAST), metadata=c.admin
        )
        watchers = [Watcher(c, p, table_id) for p in players]
        played: list[str] = []
        seen_rounds: set[str] = set()
        while len(played) < ROUNDS:
            opened = await watchers[0].wait_for(lambda u: kind(u) == "round_opened" and u.round_id not in seen_rounds)
            seen_rounds.add(opened.round_id)
            if await bet_randomly(c, players, table_id, opened.round_id, rng):
                played.append(opened.round_id)
        await watchers[0].wait_for(lambda u: kind(u) == "seed_revealed" and u.round_id == played[-1])
        await settle_everything(c, players)

        balances = await all_balances(c)
        assert total_money(balances) == 3 * DEPOSIT_MINOR
        assert balances[EXTERNAL][0] + total_money(balances) == 0
        await ledger_matches_wallet(c)
        for w in watchers:
            await w.stop()
            card_updates_are_reveals(w.updates)
            mine = [u.my_bet_placed for u in w.updates if kind(u) == "my_bet_placed"]
            assert mine and all(b.player == w.player.account for b in mine)
        for round_id in played:
            await verify_round(c, players[0], table_id, round_id)

    argv = ["replay", "--schema", stack.schema_of("ledger"), "--topic-prefix", stack.prefix]
    argv += ["--wallet", stack.addr("wallet"), "--dsn", stack.infra["DATABASE_URL"], "--no-progress"]
    audit = await asyncio.create_subprocess_exec(
        str(BIN / "niuniu-audit"), *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    report, _ = await audit.communicate()
    assert audit.returncode == 0, report.decode()

    # Every round re-dealt from its revealed seed and re-settled with the rules, against the journal.
    limit = asyncio.Semaphore(4)

    async def verify_journal(round_id: str) -> None:
        async with limit:
            checker = await asyncio.create_subprocess_exec(
                str(BIN / "niuniu-audit"), "verify-round", round_id, "--schema", stack.schema_of("ledger"),
                "--topic-prefix", stack.prefix, "--dsn", stack.infra["DATABASE_URL"], "--table", stack.addr("table"),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            out, _ = await checker.communicate()
        text = out.decode()
        assert checker.returncode == 0 and "recompute: done" in text and "RESULT: OK" in text, text

    await asyncio.gather(*(verify_journal(round_id) for round_id in played))
    assert "differences: 0" in report.decode() and "RESULT: OK" in report.decode(), report.decode()


@pytest.mark.parametrize("phase", ["betting", "revealing", "settled"])
async def test_table_killed_in_a_phase_resumes_without_losing_money(stack: Stack, phase: str) -> None:
    table_id = f"gb-kill-{phase}"
    limits = ev.TableLimits(
        min_bet_minor=100,
        max_bet_minor=5_000,
        chips_minor=[100],
        betting_seconds=2,
        reveal_interval_ms=400,
        pause_between_rounds_ms=200,
    )
    async with connect(stack) as c:
        players = [await register(c, f"k{phase}{i}x{stack.run_id}", 100_000) for i in range(2)]
        before = total_money(await all_balances(c))
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant="golden_bull", limits=limits), metadata=c.admin
        )
        watcher = Watcher(c, players[0], table_id)
        opened = await watcher.wait_for(lambda u: kind(u) == "round_opened")
        for p in players:
            for area in ("area_1", "area_2", "area_3"):
                await c.table.PlaceBet(
                    table_pb2.PlaceBetRequest(
                        command_id=f"{opened.round_id}.{p.name}.{area}", table_id=table_id, area=area, amount_minor=500
                    ),
                    metadata=p.auth,
                )
        if phase == "revealing":
            await watcher.wait_for(lambda u: kind(u) == "hand_revealed" and u.round_id == opened.round_id)
        elif phase == "settled":
            await watcher.wait_for(lambda u: kind(u) == "result" and u.round_id == opened.round_id)
        stack.kill("table")
        stack.start("table")
        result = await watcher.wait_for(lambda u: kind(u) == "result" and u.round_id == opened.round_id)
        assert result.result.status == "settled"
        assert len(result.result.my_bets) == 3
        await watcher.wait_for(lambda u: kind(u) == "seed_revealed" and u.round_id == opened.round_id)
        await settle_everything(c, players)
        assert total_money(await all_balances(c)) == before
        await watcher.stop()
        card_updates_are_reveals(watcher.updates)
        await verify_round(c, players[0], table_id, opened.round_id)


async def test_bad_bets_are_refused_with_a_reason_and_change_nothing(stack: Stack) -> None:
    table_id = "gb-rules"
    limits = ev.TableLimits(
        min_bet_minor=100,
        max_bet_minor=2_000,
        chips_minor=[100],
        betting_seconds=4,
        reveal_interval_ms=10,
        pause_between_rounds_ms=100,
    )
    async with connect(stack) as c:
        rich = await register(c, f"rich{stack.run_id}", 100_000)
        poor = await register(c, f"poor{stack.run_id}", 1_000)
        excluded = await register(c, f"excl{stack.run_id}", 100_000)
        await c.wallet.SelfExclude(
            wallet_pb2.SelfExcludeRequest(account=excluded.account, days=7), metadata=excluded.auth
        )
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant="golden_bull", limits=limits), metadata=c.admin
        )
        watcher = Watcher(c, rich, table_id)
        opened = await watcher.wait_for(lambda u: kind(u) == "round_opened")
        before = await all_balances(c)

        def order(n: str, area: str, amount: int) -> table_pb2.PlaceBetRequest:
            return table_pb2.PlaceBetRequest(
                command_id=f"{opened.round_id}.{n}",
                table_id=table_id,
                area=area,
                amount_minor=amount,
                round_id=opened.round_id,
            )

        def bet(
            p: Player, n: str, area: str, amount: int
        ) -> grpc.aio.UnaryUnaryCall[table_pb2.PlaceBetRequest, table_pb2.BetReceipt]:
            return c.table.PlaceBet(order(n, area, amount), metadata=p.auth)

        await expect_refused(bet(rich, "a", "area_9", 100), grpc.StatusCode.INVALID_ARGUMENT, "AREA_UNKNOWN")
        await expect_refused(
            bet(rich, "b", "area_1", 2_100), grpc.StatusCode.FAILED_PRECONDITION, "ABOVE_TABLE_MAXIMUM"
        )
        await expect_refused(bet(rich, "c", "area_1", 150), grpc.StatusCode.INVALID_ARGUMENT, "NOT_A_CHIP_AMOUNT")
        await expect_refused(bet(rich, "d", "area_1", -100), grpc.StatusCode.INVALID_ARGUMENT, "AMOUNT_INVALID")
        await expect_refused(bet(poor, "e", "area_1", 1_000), grpc.StatusCode.FAILED_PRECONDITION, "INSUFFICIENT_FUNDS")
        await expect_refused(bet(excluded, "f", "area_1", 100), grpc.StatusCode.FAILED_PRECONDITION, "SELF_EXCLUDED")
        anonymous = c.table.PlaceBet(table_pb2.PlaceBetRequest(command_id="x", table_id=table_id, area="area_1"))
        await expect_refused(anonymous, grpc.StatusCode.UNAUTHENTICATED, "TOKEN_MISSING")

        # The same mistakes in one PlaceBets call: each bet's own refusal, code and reason, in order.
        invalid, precondition = grpc.StatusCode.INVALID_ARGUMENT.value[0], grpc.StatusCode.FAILED_PRECONDITION.value[0]
        mistakes = [order("h", "area_9", 100), order("i", "area_1", 2_100), order("j", "area_1", 150)]
        answer = await c.table.PlaceBets(table_pb2.PlaceBetsRequest(bets=mistakes), metadata=rich.auth)
        assert [(o.refused.code, o.refused.reason) for o in answer.outcomes] == [
            (invalid, "AREA_UNKNOWN"),
            (precondition, "ABOVE_TABLE_MAXIMUM"),
            (invalid, "NOT_A_CHIP_AMOUNT"),
        ]
        short = table_pb2.PlaceBetsRequest(bets=[order("k", "area_1", 1_000)])
        answer = await c.table.PlaceBets(short, metadata=poor.auth)
        assert [(o.refused.code, o.refused.reason) for o in answer.outcomes] == [(precondition, "INSUFFICIENT_FUNDS")]
        too_many = table_pb2.PlaceBetsRequest(bets=[order(f"l{n}", "area_1", 100) for n in range(17)])
        await expect_refused(
            c.table.PlaceBets(too_many, metadata=rich.auth), grpc.StatusCode.INVALID_ARGUMENT, "BETS_COUNT"
        )
        twice = table_pb2.PlaceBetsRequest(bets=[order("m", "area_1", 100), order("m", "area_2", 100)])
        await expect_refused(
            c.table.PlaceBets(twice, metadata=rich.auth), grpc.StatusCode.INVALID_ARGUMENT, "COMMAND_ID_REPEATED"
        )
        await expect_refused(c.table.PlaceBets(twice), grpc.StatusCode.UNAUTHENTICATED, "TOKEN_MISSING")

        closed = ("phase_changed", "dealing", opened.round_id)
        await watcher.wait_for(lambda u: (kind(u), u.phase_changed.phase, u.round_id) == closed)
        await expect_refused(bet(rich, "g", "area_1", 100), grpc.StatusCode.FAILED_PRECONDITION, "BETTING_CLOSED")

        assert await all_balances(c) == before
        view = await c.table.GetRound(
            table_pb2.GetRoundRequest(table_id=table_id, round_id=opened.round_id), metadata=c.admin
        )
        assert list(view.my_bets) == []
        await watcher.stop()
