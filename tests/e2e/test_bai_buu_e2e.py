"""Bai Buu end to end: four service processes, real Kafka, PostgreSQL and Redis.

Four tables play at once, four players betting on every area (main bets and the
jackpot side bets) for 32 rounds (100 at full length): every hold is resolved, the money
adds up including the jackpot pool, the ledger's audit replay is clean and every
round verifies from its revealed seed. The module's rng runs with test decks
(NIUNIU_RNG_TEST_DECKS=1; refused by default and with a real secret, shown on
extra rng processes), so the seed's two settlement examples are played through
the gRPC API from known decks, a four of a kind split between two
hands pays the pool out exactly, and two tables hitting the pool at the same
moment pay it once: it never goes negative.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence

import grpc
import pytest
from niuniu.rng.v1 import rng_pb2, rng_pb2_grpc
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from niuniu.wallet.v1 import wallet_pb2
from play import (
    EXTERNAL,
    TEST_DECKS_ENV,
    WAIT_S,
    Watcher,
    audit_replay_is_clean,
    card_updates_are_reveals,
    connect,
    env_var,
    expect_refused,
    game_length,
    kind,
    ledger_matches_wallet,
    settle_everything,
    total_money,
    update_is,
)
from players import Clients, Player, all_balances, register
from stack import BIN, HEALTH_TIMEOUT_S, ROOT, Stack, free_port

from backbone import keys
from backbone.config import service_dsn
from backbone.healthcheck import check
from bull.cards import DECK_52, parse_cards
from bull.rules import bai_buu
from tools import verify
from tools.migrate import migrate

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUNDS = game_length(ci=32, full=100)
TABLES = ("bb-a", "bb-b", "bb-c", "bb-d")
DEPOSIT_MINOR = 2_000_000
JACKPOT_STAKE = 100  # the default jackpot.stake_minor: $1.00
POOL_SHARE = JACKPOT_STAKE * 1_000 // 10_000  # the default jackpot.pool_share_bps: 10 %
MAIN = bai_buu.MAIN_AREAS
JACKPOTS = bai_buu.JACKPOT_AREAS
FAST = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=50_000,
    chips_minor=[100],
    betting_seconds=1,
    reveal_interval_ms=5,
    pause_between_rounds_ms=50,
)
# Rounds with a test deck: long enough to bet by hand, quick to reveal. Such a round's deck is
# set for its id, so a bet cannot move on to the next round: the window leaves room for the
# stream to be late and the bets to be slow on a loaded machine (three seconds once did not).
FORCED = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=100_000,
    chips_minor=[100],
    betting_seconds=8,
    reveal_interval_ms=5,
    pause_between_rounds_ms=50,
)


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module", autouse=True)
def _rng_with_test_decks() -> Iterator[None]:
    """This module's stack runs its rng with test decks (autouse: set before ``stack`` starts).

    Rounds without a test deck are dealt exactly as by default, which their verification
    from the revealed seed proves; the default itself is shown on a second rng process.
    """
    with env_var(TEST_DECKS_ENV, "1"):
        yield


@contextlib.asynccontextmanager
async def extra_rng(stack: Stack, name: str, env: dict[str, str]) -> AsyncIterator[tuple[subprocess.Popen[bytes], str]]:
    """One more rng process with its own ports, topics and schema, so it disturbs nothing of the stack's."""
    port = free_port()
    base = stack.env("rng")
    base.pop(TEST_DECKS_ENV, None)
    base.update(
        {
            "NIUNIU_RNG_GRPC_PORT": str(port),
            "NIUNIU_RNG_METRICS_PORT": str(free_port()),
            "NIUNIU_TOPIC_PREFIX": f"{stack.prefix}{name}.",
            "NIUNIU_DB_SCHEMA": f"{stack.schema_of('rng')}_{name}",
        }
    )
    base.update(env)
    migrate("rng", service_dsn("rng", base), base["NIUNIU_DB_SCHEMA"])
    log = (stack.log_dir / f"rng-{name}.log").open("ab")
    proc = subprocess.Popen([str(BIN / "niuniu-rng")], env=base, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        yield proc, f"127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=20)


async def serving(proc: subprocess.Popen[bytes], addr: str) -> bool:
    """Wait until the process serves (True) or exits (False)."""
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if check(addr) == "SERVING":
            return True
        await asyncio.sleep(0.2)
    raise AssertionError("the extra rng neither served nor exited")


def deck_of(*hands: str) -> list[str]:
    """A full deck order dealing these hands (banker, player_01..03), the unused cards after."""
    dealt = parse_cards(" ".join(hands), size=4 * len(hands))
    return [card.code for card in (*dealt, *(c for c in DECK_52 if c not in dealt))]


async def set_test_deck(stack: Stack, c: Clients, round_id: str, cards: Sequence[str]) -> None:
    async with grpc.aio.insecure_channel(stack.addr("rng")) as channel:
        rng = rng_pb2_grpc.RngStub(channel)
        await rng.SetTestDeck(rng_pb2.SetTestDeckRequest(round_id=round_id, cards=cards), metadata=c.admin)


async def bet(c: Clients, p: Player, table_id: str, round_id: str, area: str, amount: int, n: str = "") -> None:
    request = table_pb2.PlaceBetRequest(
        command_id=f"{round_id}.{p.name}.{area}{n}",
        table_id=table_id,
        area=area,
        amount_minor=amount,
        round_id=round_id,
    )
    await c.table.PlaceBet(request, metadata=p.auth)


async def bet_randomly(
    c: Clients, players: Sequence[Player], table_id: str, round_id: str, rng: random.Random
) -> set[str]:
    """Random bets from each player; the accounts whose bets the round took (late ones are refused)."""
    placed: set[str] = set()
    for p in players:
        areas = rng.sample(MAIN, rng.randint(0, 3)) + rng.sample(JACKPOTS, rng.randint(0, 2))
        for area in areas:
            amount = JACKPOT_STAKE if area in JACKPOTS else 100 * rng.randint(1, 20)
            try:
                await bet(c, p, table_id, round_id, area, amount)
                placed.add(p.account)
            except grpc.aio.AioRpcError as error:
                # Only a closing window may refuse: closed, or already the next round's (a late bet).
                assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
                assert ("BETTING_CLOSED" in (error.details() or "")) or ("ROUND_MISMATCH" in (error.details() or ""))
    return placed


async def round_view(c: Clients, table_id: str, round_id: str, *, seed: bool = True) -> table_pb2.RoundView:
    """The round's record as an admin sees it, once settled (and its seed revealed)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        view = await c.table.GetRound(table_pb2.GetRoundRequest(table_id=table_id, round_id=round_id), metadata=c.admin)
        if view.phase == "settled" and (view.server_seed or not seed):
            return view
        assert time.monotonic() < deadline, f"{round_id} never settled with its seed revealed"
        await asyncio.sleep(0.1)


def dealt_in_deck_order(view: table_pb2.RoundView) -> str:
    """Head and last of each hand, in the deal's order (banker, player_01..03)."""
    cards: dict[str, list[str]] = {seat: [] for seat in bai_buu.SEATS}
    for hand in view.hands:
        cards[hand.seat].extend(hand.cards)
    return " ".join(" ".join(cards[seat]) for seat in bai_buu.SEATS)


def verify_code(view: table_pb2.RoundView) -> int:
    argv = ["--commitment", view.commitment, "--seed", view.server_seed, "--round", view.round_id]
    argv += ["--client-seed", view.client_seed, "--deck", "52", "--dealt", dealt_in_deck_order(view)]
    with contextlib.redirect_stdout(io.StringIO()):
        return verify.main(argv)


REVEAL_ORDER = [(seat, group) for group in ("head", "last") for seat in (*bai_buu.PLAYER_SEATS, bai_buu.BANKER)]
"""Every hand's head, players first and the banker last; then every hand's last two cards."""


def hands_in_deal_order(view: table_pb2.RoundView) -> None:
    """GetRound lists the hands in the deal's order: the banker, then player_01..03, head then last."""
    order = [(h.seat, h.group) for h in view.hands]
    assert order == [(seat, group) for seat in bai_buu.SEATS for group in ("head", "last")], order
    assert all(len(h.cards) == 2 for h in view.hands)
    assert all(bool(h.hand_category) == (h.group == "last") for h in view.hands)


def revealed_group_by_group(updates: Sequence[table_pb2.TableUpdate], round_id: str) -> None:
    """The stream reveals a round's hands group by group (the rule's order)."""
    reveals = [u.hand_revealed for u in updates if kind(u) == "hand_revealed" and u.round_id == round_id]
    assert [(h.seat, h.group) for h in reveals] == REVEAL_ORDER


async def jackpot(c: Clients, player: Player, *, settled: bool = True, table_id: str = TABLES[0]) -> table_pb2.Jackpot:
    """The pool (one for every table) through a table's GetJackpot; with ``settled``, once nothing is in flight."""
    deadline = time.monotonic() + WAIT_S
    while True:
        pot = await c.table.GetJackpot(table_pb2.GetJackpotRequest(table_id=table_id), metadata=player.auth)
        if not settled or pot.in_flight_payouts_minor == 0:
            return pot
        assert time.monotonic() < deadline, "pool payouts never applied by the wallet"
        await asyncio.sleep(0.1)


async def wallet_applied(c: Clients, round_id: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        with contextlib.suppress(grpc.aio.AioRpcError):
            record = await c.wallet.GetRoundSettlement(
                wallet_pb2.GetRoundSettlementRequest(round_id=round_id), metadata=c.auditor
            )
            assert record.status == "settled", record
            return
        assert time.monotonic() < deadline, f"the wallet never applied {round_id}"
        await asyncio.sleep(0.1)


async def pool_balance(c: Clients) -> int:
    return (await all_balances(c))["jackpot_pool"][0]


# --------------------------------------------------------------------------- tests


async def test_test_decks_are_refused_by_default(stack: Stack) -> None:
    async with (
        extra_rng(stack, "default", {}) as (default, addr),
        connect(stack) as c,
        grpc.aio.insecure_channel(addr) as channel,
    ):
        assert await serving(default, addr)
        rng = rng_pb2_grpc.RngStub(channel)
        player = await register(c, f"nodeck{stack.run_id}", 0)
        request = rng_pb2.SetTestDeckRequest(round_id="bb-nodeck-r1", cards=[c.code for c in DECK_52])
        await expect_refused(
            rng.SetTestDeck(request, metadata=c.admin), grpc.StatusCode.FAILED_PRECONDITION, "TEST_DECKS_DISABLED"
        )
        await expect_refused(
            rng.SetTestDeck(request, metadata=player.auth), grpc.StatusCode.PERMISSION_DENIED, "ROLE_NOT_ALLOWED"
        )
        await expect_refused(rng.SetTestDeck(request), grpc.StatusCode.UNAUTHENTICATED, "TOKEN_MISSING")


async def test_test_decks_with_a_real_secret_refuse_to_start(stack: Stack) -> None:
    directory = stack.log_dir / "real-keys"
    keys.generate(directory)  # a deployment: real keys, not in development mode
    real = dict(line.removeprefix("export ").split("=", 1) for line in (directory / "env").read_text().splitlines())
    real |= {TEST_DECKS_ENV: "1", "NIUNIU_ENV": "production"}
    async with extra_rng(stack, "realsecret", real) as (proc, addr):
        assert not await serving(proc, addr)
        assert proc.returncode != 0
    assert "is for tests only" in (stack.log_dir / "rng-realsecret.log").read_text()


async def test_four_tables_play_with_every_bet_and_everything_reconciles(stack: Stack) -> None:
    rng = random.Random(20260602)
    async with connect(stack) as c:
        money_before = total_money(await all_balances(c))
        players = [await register(c, f"bb{i}x{stack.run_id}", DEPOSIT_MINOR) for i in range(4)]
        pool_before = await pool_balance(c)
        # The pool's own arithmetic below counts every pool-share win as paid from the pool; with the
        # house's floor (default: a four of a kind never paid below the three-of-a-kind prize) a win
        # on a small pool is mostly the house's. The floor is played in test_rules_fidelity_e2e.
        pool_only = {"jackpot.four_of_a_kind_floor": "false"}
        for table_id in TABLES:
            await c.table.CreateTable(
                table_pb2.CreateTableRequest(table_id=table_id, variant="bai_buu", config=pool_only, limits=FAST),
                metadata=c.admin,
            )
        info = await c.table.GetTable(table_pb2.GetTableRequest(table_id=TABLES[0]), metadata=players[0].auth)
        assert list(info.areas) == [*MAIN, *JACKPOTS] and info.hold_multiplier == "1"
        # One player watches each table (another watches two of them): redaction is checked per watcher.
        watchers = {t: [Watcher(c, players[i % len(players)], t)] for i, t in enumerate(TABLES)}
        watchers[TABLES[0]].append(Watcher(c, players[1], TABLES[0]))
        played: dict[str, list[str]] = {t: [] for t in TABLES}

        async def play(table_id: str) -> None:
            """Enough rounds with bets, and a bet of each watcher's own player among them.

            The windows are a second long, so a loaded machine can make every bet of one player
            late in a table's rounds; the watcher would then have none of its own to see.
            """
            seen: set[str] = set()
            first = True
            unseen = {w.player.account for w in watchers[table_id]}
            while len(played[table_id]) < ROUNDS // len(TABLES) or unseen:
                assert len(seen) < 4 * ROUNDS, f"{table_id}: {unseen} never got a bet in"
                opened = await watchers[table_id][0].wait_for(
                    lambda u: kind(u) == "round_opened" and u.round_id not in seen
                )
                seen.add(opened.round_id)
                if first:  # a jackpot costs exactly its stake, whatever the table's chips
                    first = False
                    await expect_refused(
                        bet(c, players[0], table_id, opened.round_id, "jackpot_banker", 200),
                        grpc.StatusCode.INVALID_ARGUMENT,
                        "FIXED_STAKE_REQUIRED",
                    )
                placed = await bet_randomly(c, players, table_id, opened.round_id, rng)
                if placed:
                    played[table_id].append(opened.round_id)
                    unseen -= placed

        started = time.monotonic()
        await asyncio.gather(*(play(t) for t in TABLES))
        for t in TABLES:
            await watchers[t][0].wait_for(update_is("seed_revealed", played[t][-1]))
        await settle_everything(c, players)
        play_s = time.monotonic() - started

        balances = await all_balances(c)
        assert total_money(balances) == money_before + len(players) * DEPOSIT_MINOR  # the pool included
        assert balances[EXTERNAL][0] + total_money(balances) == 0
        await ledger_matches_wallet(c)
        for t in TABLES:
            for w in watchers[t]:
                await w.stop()
                card_updates_are_reveals(w.updates)
                mine = [u.my_bet_placed for u in w.updates if kind(u) == "my_bet_placed"]
                assert mine and all(b.player == w.player.account for b in mine)

        # The round history a frontend shows: every bet with its odds, amount and result.
        outcomes: Counter[tuple[str, str]] = Counter()
        nets: Counter[str] = Counter()
        contributions = pool_payouts = 0
        for t in TABLES:
            for round_id in played[t]:
                view = await round_view(c, t, round_id)
                hands_in_deal_order(view)
                revealed_group_by_group(watchers[t][0].updates, round_id)
                assert verify_code(view) == 0, f"{round_id} does not verify from its revealed seed"
                assert set(view.area_outcomes) == set(MAIN + JACKPOTS)
                for b in view.my_bets:
                    kind_ = "jackpot" if b.area in JACKPOTS else "main"
                    outcomes[(kind_, b.outcome)] += 1
                    nets[b.player] += b.net_minor
                    assert b.odds == view.area_odds[b.area]
                    if kind_ == "main":
                        assert b.odds == "2" and -b.net_minor <= b.stake_minor
                    else:
                        assert b.stake_minor == JACKPOT_STAKE
                        contributions += POOL_SHARE
                        if b.outcome == "win" and not b.odds:  # a share of the pool
                            pool_payouts += b.net_minor + b.stake_minor
        for p in players:
            assert balances[p.account] == (DEPOSIT_MINOR + nets[p.account], 0)
        assert await pool_balance(c) == pool_before + contributions - pool_payouts
        assert {("main", "win"), ("main", "loss"), ("jackpot", "loss")} <= set(outcomes)
        bets = sum(outcomes.values())
        rounds = sum(len(r) for r in played.values())
        assert rounds >= ROUNDS
        print(
            f"\nbai buu: {rounds} rounds on {len(TABLES)} tables in {play_s:.0f}s, {bets} bets;"
            f" outcomes {dict(outcomes)}; pool +{contributions} contributions, -{pool_payouts} paid"
        )


async def test_the_seed_examples_settle_through_the_api(stack: Stack) -> None:
    table_id = "bb-seed"
    example_1 = deck_of("7S 7H 7C 2D", "2S 3H 8C JD", "5S 5H 5C 3D", "KS KH KC 9D")
    example_2 = deck_of("2S 4H 8C 7D", "3S 4C 9H 5S", "5H 9C 8H 7S", "3D 5D 6C 3H")
    async with connect(stack) as c:
        await set_test_deck(stack, c, f"{table_id}-r1", example_1)  # before the round even exists
        await set_test_deck(stack, c, f"{table_id}-r2", example_2)
        p = await register(c, f"seed{stack.run_id}", 100_000)
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant="bai_buu", limits=FORCED), metadata=c.admin
        )
        watcher = Watcher(c, p, table_id)

        r1 = (await watcher.wait_for(lambda u: kind(u) == "round_opened")).round_id
        for area, amount in [("banker_01", 10_000), ("player_01", 10_000)]:
            await bet(c, p, table_id, r1, area, amount)
        for area in ("jackpot_player_01", "jackpot_player_02"):
            await bet(c, p, table_id, r1, area, JACKPOT_STAKE)
        r2 = (await watcher.wait_for(lambda u: kind(u) == "round_opened" and u.round_id != r1)).round_id
        for area in ("banker_02", "player_03", "player_02", "player_01"):
            await bet(c, p, table_id, r2, area, 10_000)
        for area in ("jackpot_banker", "jackpot_player_02"):
            await bet(c, p, table_id, r2, area, JACKPOT_STAKE)

        view_1 = await round_view(c, table_id, r1)
        view_2 = await round_view(c, table_id, r2)
        # Type, odds, amount, win/lose: the seed's examples table, row by row.
        rows_1 = {(b.area, b.odds, b.stake_minor, b.net_minor) for b in view_1.my_bets}
        assert rows_1 == {
            ("banker_01", "2", 10_000, 10_000),
            ("player_01", "2", 10_000, -10_000),
            ("jackpot_player_01", "", 100, -100),
            ("jackpot_player_02", "50", 100, 4_900),
        }
        result_1 = {area: view_1.area_outcomes[area] for area in ("banker_01", "banker_02", "player_03")}
        assert result_1 == {"banker_01": "win", "banker_02": "win", "player_03": "win"}
        assert [a for a in JACKPOTS if view_1.area_outcomes[a] == "win"] == [
            "jackpot_banker",
            "jackpot_player_02",
            "jackpot_player_03",
        ]
        rows_2 = {(b.area, b.odds, b.stake_minor, b.outcome, b.net_minor) for b in view_2.my_bets}
        assert rows_2 == {
            ("banker_02", "2", 10_000, "half_win", 5_000),
            ("player_03", "2", 10_000, "win", 10_000),
            ("player_02", "2", 10_000, "loss", -10_000),
            ("player_01", "2", 10_000, "push", 0),
            ("jackpot_banker", "", 100, "loss", -100),
            ("jackpot_player_02", "", 100, "loss", -100),
        }
        assert view_2.area_outcomes["player_01"] == "push" and view_2.area_outcomes["banker_02"] == "half_win"

        # The same figures reached the player live, and the wallet paid exactly them.
        for round_id, net in ((r1, 10_000 - 10_000 - 100 + 4_900), (r2, 5_000 + 10_000 - 10_000 - 200)):
            result = await watcher.wait_for(update_is("result", round_id))
            assert result.result.my_net_minor == net
        await settle_everything(c, [p])
        balance = await c.wallet.GetBalance(wallet_pb2.GetBalanceRequest(account=p.account), metadata=p.auth)
        assert (balance.available_minor, balance.held_minor) == (100_000 + 4_800 + 4_800, 0)

        hands_in_deal_order(view_1)
        revealed_group_by_group(watcher.updates, r1)
        assert [(h.seat, list(h.cards), h.category) for h in view_1.hands if (h.seat, h.group) == REVEAL_ORDER[0]] == [
            ("player_01", ["2S", "3H"], "points_5")
        ]
        assert {h.seat: h.hand_category for h in view_1.hands if h.group == "last"}["banker"] == "three_of_a_kind"
        # A test deck is not derived from the seed: such a round can never pass for a fair one.
        assert verify_code(view_1) == 1 and verify_code(view_2) == 1
        await watcher.stop()
        card_updates_are_reveals(watcher.updates)


async def test_four_of_a_kind_in_two_hands_splits_the_pool_exactly(stack: Stack) -> None:
    table_id = "bb-quads"
    async with connect(stack) as c:
        await set_test_deck(
            stack, c, f"{table_id}-r1", deck_of("9S 9H 9C 9D", "2S 2H 2C 2D", "3S 4H 8C JD", "QS QH KC 7C")
        )
        players = [await register(c, f"quad{i}x{stack.run_id}", 10_000) for i in range(4)]
        await c.wallet.Deposit(  # the operator seeds the pool
            wallet_pb2.DepositRequest(
                request_id=f"seed-pool-{stack.run_id}", account="jackpot_pool", amount_minor=100_001
            ),
            metadata=c.admin,
        )
        before = await jackpot(c, players[0])
        assert before.stake_minor == JACKPOT_STAKE and before.payable_minor == before.balance_minor
        by_hands = {"jackpot.split": "hands"}  # the old reading; the default splits among winning bets
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant="bai_buu", config=by_hands, limits=FORCED),
            metadata=c.admin,
        )
        watcher = Watcher(c, players[0], table_id)
        round_id = (await watcher.wait_for(lambda u: kind(u) == "round_opened")).round_id
        areas = ("jackpot_banker", "jackpot_player_01", "jackpot_player_01", "jackpot_player_02")
        for p, area in zip(players, areas, strict=True):
            await bet(c, p, table_id, round_id, area, JACKPOT_STAKE)
        view = await round_view(c, table_id, round_id)
        await wallet_applied(c, round_id)
        await settle_everything(c, players)

        pool = before.balance_minor + 4 * POOL_SHARE  # this round's contributions join before it pays
        banker_share, player_01_share = pool // 2, pool // 4  # two hands, then two bets on player_01
        nets = {b.player: b.net_minor for b in view.my_bets}
        expected = [banker_share - 100, player_01_share - 100, player_01_share - 100, -100]
        assert [nets[p.account] for p in players] == expected
        after = await jackpot(c, players[0])
        assert after.balance_minor == pool - banker_share - 2 * player_01_share  # what division leaves stays
        assert after.balance_minor >= 0 and after.in_flight_payouts_minor == 0
        for p, net in zip(players, expected, strict=True):
            assert (await all_balances(c))[p.account] == (10_000 + net, 0)
        balances = await all_balances(c)
        assert balances[EXTERNAL][0] + total_money(balances) == 0
        print(
            f"\nfour of a kind: pool {pool} -> banker {banker_share}, 2 x player_01 {player_01_share},"
            f" left {after.balance_minor}"
        )
        await watcher.stop()


async def test_two_tables_hitting_the_pool_at_once_pay_it_once(stack: Stack) -> None:
    tables = ("bb-race-1", "bb-race-2")
    quads = deck_of("KS KH KC KD", "2S 3H 8C JD", "3S 4H 9C TD", "QS QH 5C 7C")
    async with connect(stack) as c:
        for t in tables:
            await set_test_deck(stack, c, f"{t}-r1", quads)
        players = [await register(c, f"race{i}x{stack.run_id}", 10_000) for i in range(2)]
        await c.wallet.Deposit(  # a pool worth paying twice, if the table let it
            wallet_pb2.DepositRequest(
                request_id=f"race-pool-{stack.run_id}", account="jackpot_pool", amount_minor=50_000
            ),
            metadata=c.admin,
        )
        # The pool alone pays here: the house's floor (a four of a kind never below the three of
        # a kind prize) would top up the table that finds the pool already paid.
        pool_only = {"jackpot.four_of_a_kind_floor": "false"}
        for t in tables:
            await c.table.CreateTable(
                table_pb2.CreateTableRequest(table_id=t, variant="bai_buu", config=pool_only, limits=FORCED),
                metadata=c.admin,
            )
        before = await jackpot(c, players[0], table_id=tables[0])  # nobody has bet yet
        watchers = [Watcher(c, players[0], t) for t in tables]
        for p, t, w in zip(players, tables, watchers, strict=True):
            round_id = (await w.wait_for(lambda u: kind(u) == "round_opened")).round_id
            await bet(c, p, t, round_id, "jackpot_banker", JACKPOT_STAKE)
        views = [await round_view(c, t, f"{t}-r1", seed=False) for t in tables]
        for t in tables:
            await wallet_applied(c, f"{t}-r1")
        await settle_everything(c, players)

        # Whichever settled first took the pool and its own contribution; the other found the
        # first payout in flight (or applied) and could pay only its own contribution.
        nets = sorted(v.my_bets[0].net_minor for v in views)
        assert nets == [POOL_SHARE - JACKPOT_STAKE, before.balance_minor + POOL_SHARE - JACKPOT_STAKE]
        after = await jackpot(c, players[0], table_id=tables[0])
        assert after.balance_minor == 0 == await pool_balance(c)
        await asyncio.gather(*(w.stop() for w in watchers))
        balances = await all_balances(c)
        assert balances[EXTERNAL][0] + total_money(balances) == 0
        await ledger_matches_wallet(c)


async def test_the_ledger_audit_replay_of_every_round_is_clean(stack: Stack) -> None:
    """Last: the journal rebuilt from Kafka matches the live one and the wallet, pool payouts included."""
    async with connect(stack) as c:
        await ledger_matches_wallet(c)
    await audit_replay_is_clean(stack)
