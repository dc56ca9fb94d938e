"""百變牛牛 end to end: a player banks against hundreds of bettors on the real stack.

Four service processes, real Kafka, PostgreSQL and Redis. A banker and 200 bot
bettors (registered through the wallet) play 6 rounds (20 at full length); then the money adds up,
every hold (the bettors' and the banker's) is resolved, the audit replay is clean,
and every round verifies: the 54-card deck from the revealed seed, with the dealt
prefix rebuilt by the deal convention (the drawn card, burned, then round-robin
from the seat it picks), and every bet's result recomputed by the rules engine
with the banker as the party. No watcher sees a hand's fifth card before that
hand's reveal. The caps hold under concurrent betting, and each leaving rule and
the no-banker mode behave as GAME_RULES §2 says.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence

import grpc
import pytest
from google.protobuf import text_format
from niuniu.rng.v1 import rng_pb2, rng_pb2_grpc
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from niuniu.wallet.v1 import wallet_pb2
from play import (
    TEST_DECKS_ENV,
    Watcher,
    audit_replay_is_clean,
    connect,
    env_var,
    expect_refused,
    game_length,
    kind,
    ledger_matches_wallet,
    outcome,
    revealed_round,
    settle_everything,
    total_money,
    verify_round_in_journal,
)
from players import TOKENS, Clients, Player, all_balances
from stack import Stack

from backbone.auth import Role
from bull.cards import DECK_54, parse_cards
from bull.rules import baibian_bull as bb
from bull.variants.baibian_bull import dealt_prefix
from services.table.common import scoped_id
from tools import verify

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def _rng_with_test_decks() -> Iterator[None]:
    """This module's rng takes test decks (autouse: set before ``stack`` starts); other rounds deal as always."""
    with env_var(TEST_DECKS_ENV, "1"):
        yield


VARIANT = "baibian_bull"
AREAS = ("heaven", "earth", "mystic", "yellow")
# GetRound lists the hands in deal order (the banker first, each seat's face-up four then the whole
# hand); the stream reveals every face-up four, then the hands, the banker last.
DEAL_ORDER = [(group, seat) for seat in ("banker", *AREAS) for group in ("face_up", "open")]
REVEALS = [(group, seat) for group in ("face_up", "open") for seat in (*AREAS, "banker")]
BETTORS = 200
ROUNDS = game_length(ci=6, full=20)
WAIT_S = 120.0
REGISTER_CONCURRENCY = 20
BETTORS_IN_FLIGHT = 25


def limits(betting_seconds: int = 3) -> ev.TableLimits:
    return ev.TableLimits(
        min_bet_minor=100,
        max_bet_minor=10**12,
        chips_minor=[100],
        betting_seconds=betting_seconds,
        reveal_interval_ms=5,
        pause_between_rounds_ms=50,
    )


async def new_player(c: Clients, name: str, deposit_minor: int) -> Player:
    """Registered through the wallet; the token is minted for the account, as Login would (no second hash)."""
    reply = await c.wallet.Register(
        wallet_pb2.RegisterRequest(
            request_id=f"reg-{name}", username=name, email=f"{name}@example.org", password=f"{name}-secret-pw"
        )
    )
    if deposit_minor:
        await c.wallet.Deposit(
            wallet_pb2.DepositRequest(request_id=f"dep-{name}", account=reply.account, amount_minor=deposit_minor),
            metadata=c.admin,
        )
    return Player(name, TOKENS.issue(reply.account_id, Role.PLAYER), reply.account)


async def new_players(c: Clients, prefix: str, count: int, deposit_minor: int) -> list[Player]:
    gate = asyncio.Semaphore(REGISTER_CONCURRENCY)

    async def one(i: int) -> Player:
        async with gate:
            return await new_player(c, f"{prefix}{i}", deposit_minor)

    return list(await asyncio.gather(*(one(i) for i in range(count))))


async def create_table(c: Clients, table_id: str, config: dict[str, str], betting_seconds: int = 3) -> None:
    request = table_pb2.CreateTableRequest(
        table_id=table_id, variant=VARIANT, config=config, limits=limits(betting_seconds)
    )
    await c.table.CreateTable(request, metadata=c.admin)


async def apply_banker(c: Clients, p: Player, table_id: str, capital_minor: int = 0) -> table_pb2.BankerQueue:
    request = table_pb2.ApplyBankerRequest(table_id=table_id, capital_minor=capital_minor)
    reply: table_pb2.BankerQueue = await c.table.ApplyBanker(request, metadata=p.auth)
    return reply


async def queue_of(c: Clients, table_id: str) -> table_pb2.BankerQueue:
    reply: table_pb2.BankerQueue = await c.table.GetBankerQueue(
        table_pb2.GetBankerQueueRequest(table_id=table_id), metadata=c.admin
    )
    return reply


def bet(
    c: Clients, p: Player, table_id: str, round_id: str, n: str, area: str, amount: int
) -> grpc.aio.UnaryUnaryCall[table_pb2.PlaceBetRequest, table_pb2.BetReceipt]:
    request = table_pb2.PlaceBetRequest(
        command_id=f"{round_id}.{p.name}.{n}", table_id=table_id, area=area, amount_minor=amount, round_id=round_id
    )
    return c.table.PlaceBet(request, metadata=p.auth)


async def bet_all(c: Clients, bettors: Sequence[Player], table_id: str, round_id: str, rng: random.Random) -> list[str]:
    """Every bettor bets once, BETTORS_IN_FLIGHT at a time (bots, not a thundering herd)."""
    gate = asyncio.Semaphore(BETTORS_IN_FLIGHT)

    async def one(p: Player) -> str:
        async with gate:
            amount = rng.choice([100, 500, 1_000, 10_000])
            return await outcome(bet(c, p, table_id, round_id, "0", rng.choice(AREAS), amount), "placed")

    return list(await asyncio.gather(*(one(p) for p in bettors)))


def opened_hands(view: table_pb2.RoundView) -> dict[str, list[str]]:
    return {h.seat: list(h.cards) for h in view.hands if h.group == "open"}


def verify_deal(view: table_pb2.RoundView, drawn_card: str) -> None:
    """The 54-card deck from the revealed seed; the dealt prefix rebuilt by the deal convention."""
    hands = opened_hands(view)
    assert sorted(hands) == sorted(bb.SEATS), hands
    assert [(h.group, h.seat) for h in view.hands] == DEAL_ORDER
    for h in view.hands:
        if h.group == "face_up":
            assert list(h.cards) == hands[h.seat][:4]
    prefix = dealt_prefix(drawn_card, hands)
    argv = ["--commitment", view.commitment, "--seed", view.server_seed, "--round", view.round_id]
    argv += ["--client-seed", view.client_seed, "--deck", "54", "--dealt", " ".join(prefix)]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = verify.main(argv)
    assert code == 0, out.getvalue()


def verify_settlement(view: table_pb2.RoundView, banker: str) -> dict[str, int]:
    """Every bet's outcome and net as the rules engine computes them, banker as the party; returns nets by player."""
    hands = opened_hands(view)
    bets = [b for b in view.my_bets if b.outcome != "cancelled"]
    expected = bb.settle(
        parse_cards(hands["banker"]),
        [parse_cards(hands[a]) for a in AREAS],
        [bb.Bet(b.bet_id, b.player, b.area, b.stake_minor) for b in bets],
        banker_party=banker,
    )
    by_id = {r.bet_id: r for r in expected.bets}
    nets: dict[str, int] = defaultdict(int)
    for b in bets:
        assert (b.outcome, b.net_minor) == (str(by_id[b.bet_id].outcome), by_id[b.bet_id].net_minor), b
        nets[b.player] += b.net_minor
    return nets


def fifth_cards_stay_hidden(updates: Sequence[table_pb2.TableUpdate], fifths: dict[str, dict[str, str]]) -> None:
    """No update shows a hand's fifth card before that hand's "open" reveal; reveals come in order."""
    opened: dict[str, set[str]] = defaultdict(set)
    order: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for update in updates:
        round_id = update.round_id
        if round_id not in fifths:
            continue  # a round the test did not play (before the banker sat, after they left)
        hidden = {fifth for seat, fifth in fifths.get(round_id, {}).items() if seat not in opened[round_id]}
        text = text_format.MessageToString(update)
        if kind(update) == "hand_revealed":
            hand = update.hand_revealed
            order[round_id].append((hand.group, hand.seat))
            if hand.group == "open":
                assert len(hand.cards) == 5 and hand.cards[4] == fifths[round_id][hand.seat]
                opened[round_id].add(hand.seat)
                hidden.discard(hand.cards[4])
            else:
                assert len(hand.cards) == 4
        else:
            assert "cards:" not in text, f"an update other than a reveal carried cards: {text}"
        for card in hidden:
            assert f'"{card}"' not in text, f"{round_id}: fifth card {card} shown before its reveal: {text}"
    for round_id, seen in order.items():
        assert seen == REVEALS, f"{round_id}: reveals {seen}"


def check_allowances(w: Watcher, round_ids: set[str]) -> int:
    """The watcher's BetAllowance is consistent with the caps and the totals it saw; returns how many it got."""
    count = 0
    for update in w.updates:
        if kind(update) != "bet_allowance" or update.round_id not in round_ids:
            continue
        a = update.bet_allowance
        count += 1
        assert a.table_staked_minor <= a.table_cap_minor
        assert a.table_cap_minor == a.banker_capital_minor // 10
        if a.banker == w.player.account:
            assert not a.betting_open and a.available_to_bet_minor == 0
            continue
        assert a.betting_open
        assert a.my_cap_minor == min(a.player_capital_minor // 10, a.table_cap_minor)
        room = max(0, min(a.my_cap_minor - a.my_staked_minor, a.table_cap_minor - a.table_staked_minor))
        assert a.available_to_bet_minor == room // 100 * 100
    return count


async def opened_round(w: Watcher, round_no: int) -> table_pb2.TableUpdate:
    return await w.wait_for(lambda u: kind(u) == "round_opened" and u.round_opened.round_no == round_no)


async def retire(c: Clients, banker: Player, table_id: str, w: Watcher) -> None:
    """The banker leaves; once a round opens with nobody banking, every hold of the banker's rounds can resolve."""
    gone = await c.table.LeaveBanker(table_pb2.LeaveBankerRequest(table_id=table_id), metadata=banker.auth)
    assert gone.leaving or gone.banker != banker.account
    await w.wait_for(lambda u: kind(u) == "round_opened" and not u.round_opened.banker)


async def test_a_banker_and_two_hundred_bettors_play_and_everything_adds_up(stack: Stack) -> None:
    rng = random.Random(20261130)
    table_id = "bb-main"
    banker_deposit, bettor_deposit = 200_000_000, 2_000_000
    async with connect(stack) as c:
        banker = await new_player(c, f"bank{stack.run_id}", banker_deposit)
        bettors = await new_players(c, f"bet{stack.run_id}x", BETTORS, bettor_deposit)
        everyone = [banker, *bettors]
        before = total_money(await all_balances(c))
        await create_table(c, table_id, {}, betting_seconds=5)
        queue = await apply_banker(c, banker, table_id)
        assert [e.player for e in queue.queue] == [banker.account] and queue.session_rounds == 72
        assert list(queue.chips_minor) == [100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000]
        watchers = [Watcher(c, p, table_id) for p in [banker, *bettors[:12]]]
        played: dict[str, ev.RoundOpened] = {}
        placed_total = 0
        seen: set[str] = set()
        while len(played) < ROUNDS:
            update = await watchers[0].wait_for(lambda u: kind(u) == "round_opened" and u.round_id not in seen)
            seen.add(update.round_id)
            opened = update.round_opened
            if not opened.banker:
                continue  # opened before the application was seen
            assert opened.banker == banker.account
            assert opened.table_cap_minor == opened.banker_capital_minor // 10 > 0
            results = await bet_all(c, bettors, table_id, update.round_id, rng)
            assert set(results) <= {"placed", "BETTING_CLOSED"}, set(results)
            placed_total += results.count("placed")
            played[update.round_id] = opened
        last = list(played)[-1]
        await watchers[0].wait_for(lambda u: kind(u) == "seed_revealed" and u.round_id == last)
        await retire(c, banker, table_id, watchers[0])
        await settle_everything(c, everyone)
        assert placed_total >= BETTORS * ROUNDS // 2, placed_total  # the rest: a loaded machine closed the window

        balances = await all_balances(c)
        assert total_money(balances) == before
        banker_net = 0
        fifths: dict[str, dict[str, str]] = {}
        drawn = {u.round_id: u.dealt.drawn_card for u in watchers[0].updates if kind(u) == "dealt"}
        for round_id, opened in played.items():
            view = await revealed_round(c, table_id, round_id)
            verify_deal(view, drawn[round_id])
            nets = verify_settlement(view, banker.account)
            banker_net -= sum(nets.values())
            stakes: dict[str, int] = defaultdict(int)
            for b in view.my_bets:
                stakes[b.player] += b.stake_minor
            assert sum(stakes.values()) <= opened.table_cap_minor
            assert all(s <= min(bettor_deposit, opened.banker_capital_minor) // 10 for s in stakes.values())
            fifths[round_id] = {seat: cards[4] for seat, cards in opened_hands(view).items()}
        assert balances[banker.account] == (banker_deposit + banker_net, 0)
        await ledger_matches_wallet(c)
        for round_id in list(played)[::4]:  # the auditor's tool agrees: deal and settlement from the seed
            await verify_round_in_journal(stack, round_id)
        for w in watchers:
            await w.stop()
            fifth_cards_stay_hidden(w.updates, fifths)
            assert check_allowances(w, set(played)) >= ROUNDS
    await audit_replay_is_clean(stack)


async def test_caps_hold_under_concurrent_betting(stack: Stack) -> None:
    """Table cap = banker capital / 10; a player's cap = min(player, banker capital) / 10; exact under a race."""
    table_id = "bb-caps"
    async with connect(stack) as c:
        banker = await new_player(c, f"capbank{stack.run_id}", 20_000_000)
        rich = await new_players(c, f"caprich{stack.run_id}x", 20, 10_000_000)
        small = await new_player(c, f"capsmall{stack.run_id}", 10_000)
        everyone = [banker, *rich, small]
        before = total_money(await all_balances(c))
        await create_table(c, table_id, {"banker.min_capital_minor": "400000"}, betting_seconds=10)
        await apply_banker(c, banker, table_id, capital_minor=400_000)  # whatever the rounds do, 400 000 remain
        watcher = Watcher(c, small, table_id)
        rich_watcher = Watcher(c, rich[0], table_id)

        def banked_round(u: table_pb2.TableUpdate) -> bool:
            return kind(u) == "round_opened" and u.round_opened.banker == banker.account

        first = await watcher.wait_for(banked_round)
        assert first.round_opened.table_cap_minor == 40_000
        # 60 bets of 1 000 race for a table cap of 40 000: exactly 40 fit, and 40 are recorded.
        calls = [bet(c, p, table_id, first.round_id, str(n), AREAS[n], 1_000) for p in rich for n in range(3)]
        results = await asyncio.gather(*(outcome(call, "placed") for call in calls))
        assert results.count("placed") == 40 and results.count("TABLE_CAP_REACHED") == 20, Counter(results)
        await expect_refused(
            bet(c, small, table_id, first.round_id, "late", "earth", 100),
            grpc.StatusCode.FAILED_PRECONDITION,
            "TABLE_CAP_REACHED",
        )
        full = await rich_watcher.wait_for(
            lambda u: (
                kind(u) == "bet_allowance"
                and u.round_id == first.round_id
                and u.bet_allowance.table_staked_minor == 40_000
            )
        )
        assert full.bet_allowance.available_to_bet_minor == 0

        second = await watcher.wait_for(lambda u: banked_round(u) and u.round_id != first.round_id)
        # A player with 10 000 may stake 1 000 (one tenth): 15 bets of 100 race, exactly 10 are held and placed.
        results = await asyncio.gather(
            *(outcome(bet(c, small, table_id, second.round_id, str(n), AREAS[n % 4], 100), "placed") for n in range(15))
        )
        assert results.count("placed") == 10 and results.count("INSUFFICIENT_FUNDS") == 5, results
        allowance = await watcher.wait_for(
            lambda u: (
                kind(u) == "bet_allowance"
                and u.round_id == second.round_id
                and u.bet_allowance.my_staked_minor == 1_000
            )
        )
        assert allowance.bet_allowance.my_cap_minor == 1_000
        assert allowance.bet_allowance.available_to_bet_minor == 0
        await retire(c, banker, table_id, watcher)
        await settle_everything(c, everyone)
        assert total_money(await all_balances(c)) == before
        view = await revealed_round(c, table_id, first.round_id)
        assert sum(b.stake_minor for b in view.my_bets) == 40_000 and len(view.my_bets) == 40
        view = await revealed_round(c, table_id, second.round_id)
        assert sum(b.stake_minor for b in view.my_bets if b.player == small.account) == 1_000
        await watcher.stop()
        await rich_watcher.stop()


async def test_leaving_rules_and_the_no_banker_mode(stack: Stack) -> None:
    table_id = "bb-leave"
    async with connect(stack) as c:
        first_banker = await new_player(c, f"lvbank1{stack.run_id}", 5_000_000)
        second_banker = await new_player(c, f"lvbank2{stack.run_id}", 5_000_000)
        poor_banker = await new_player(c, f"lvpoor{stack.run_id}", 3_000_000)
        p = await new_players(c, f"lvp{stack.run_id}x", 4, 1_000_000)
        everyone = [first_banker, second_banker, poor_banker, *p]
        before = total_money(await all_balances(c))
        config = {"banker.min_capital_minor": "2000000", "banker.session_rounds": "2"}
        await create_table(c, table_id, config, betting_seconds=3)
        watcher = Watcher(c, p[0], table_id)

        # Nobody banks: rounds are dealt and shown, betting is closed.
        idle = await watcher.wait_for(lambda u: kind(u) == "round_opened" and not u.round_opened.banker)
        await expect_refused(
            bet(c, p[0], table_id, idle.round_id, "x", "heaven", 100), grpc.StatusCode.FAILED_PRECONDITION, "NO_BANKER"
        )
        allowance = await watcher.wait_for(lambda u: kind(u) == "bet_allowance" and u.round_id == idle.round_id)
        assert not allowance.bet_allowance.betting_open and allowance.bet_allowance.available_to_bet_minor == 0
        await watcher.wait_for(
            lambda u: (
                kind(u) == "hand_revealed"
                and u.round_id == idle.round_id
                and u.hand_revealed.seat == "banker"
                and u.hand_revealed.group == "open"
            )
        )
        idle_result = await watcher.wait_for(lambda u: kind(u) == "result" and u.round_id == idle.round_id)
        assert idle_result.result.status == "settled"

        await apply_banker(c, first_banker, table_id)
        await apply_banker(c, poor_banker, table_id)
        await apply_banker(c, second_banker, table_id, capital_minor=2_000_000)
        await expect_refused(
            apply_banker(c, p[3], table_id, capital_minor=5_000_000),
            grpc.StatusCode.FAILED_PRECONDITION,
            "BANKER_CAPITAL_TOO_LOW",
        )
        queue = await queue_of(c, table_id)
        # In the order they applied; the first may already sit (a round can open between the calls).
        in_line = [queue.banker] if queue.banker else []
        assert [*in_line, *(e.player for e in queue.queue)] == [
            first_banker.account,
            poor_banker.account,
            second_banker.account,
        ]
        banked = await watcher.wait_for(
            lambda u: kind(u) == "round_opened" and u.round_opened.banker == first_banker.account
        )
        r1 = banked.round_id
        # Before the cards open: no bet leaves freely, a bet is refunded.
        await bet(c, p[0], table_id, r1, "a", "heaven", 1_000)
        await bet(c, p[1], table_id, r1, "a", "earth", 1_000)
        await bet(c, p[2], table_id, r1, "a", "mystic", 1_000)
        left = await c.table.LeaveTable(table_pb2.LeaveTableRequest(table_id=table_id), metadata=p[1].auth)
        assert list(left.refunded_bet_ids) == [scoped_id(p[1].account, f"{r1}.{p[1].name}.a")]  # ids are per player
        left = await c.table.LeaveTable(table_pb2.LeaveTableRequest(table_id=table_id), metadata=p[3].auth)
        assert list(left.refunded_bet_ids) == []
        # The banker leaves during the betting window: this round still settles with them as the party.
        gone = await c.table.LeaveBanker(table_pb2.LeaveBankerRequest(table_id=table_id), metadata=first_banker.auth)
        assert gone.banker == first_banker.account and gone.leaving
        withdraw = wallet_pb2.WithdrawRequest(
            request_id=f"wd-{poor_banker.name}", account=poor_banker.account, amount_minor=1_500_000
        )
        await c.wallet.Withdraw(withdraw, metadata=c.admin)
        # During the opening: leaving settles normally.
        await watcher.wait_for(lambda u: kind(u) == "hand_revealed" and u.round_id == r1)
        left = await c.table.LeaveTable(table_pb2.LeaveTableRequest(table_id=table_id), metadata=p[2].auth)
        assert list(left.refunded_bet_ids) == []
        result = await watcher.wait_for(lambda u: kind(u) == "result" and u.round_id == r1)
        assert result.result.status == "settled"
        view = await revealed_round(c, table_id, r1)
        outcomes = {b.player: b.outcome for b in view.my_bets}
        assert outcomes[p[1].account] == "cancelled"
        assert outcomes[p[0].account] in ("win", "loss") and outcomes[p[2].account] in ("win", "loss")
        nets = verify_settlement(view, first_banker.account)
        await settle_everything(c, [first_banker])
        balance = await c.wallet.GetBalance(
            wallet_pb2.GetBalanceRequest(account=first_banker.account), metadata=c.admin
        )
        assert (balance.available_minor, balance.held_minor) == (5_000_000 - sum(nets.values()), 0)

        # Next in line: the poor banker, whose capital fell below the minimum while waiting (skipped), then the
        # second banker, for a session of two rounds with the capital they asked for.
        r1_no = banked.round_opened.round_no
        sessions = [await opened_round(watcher, r1_no + n) for n in (1, 2)]
        assert [s.round_opened.banker for s in sessions] == [second_banker.account] * 2
        assert sessions[0].round_opened.banker_capital_minor == 2_000_000
        after = await opened_round(watcher, r1_no + 3)
        assert after.round_opened.banker == ""  # session complete, queue empty: betting closes again
        queue = await queue_of(c, table_id)
        assert queue.banker == "" and list(queue.queue) == []

        await watcher.wait_for(lambda u: kind(u) == "seed_revealed" and u.round_id == after.round_id)
        await settle_everything(c, everyone)
        assert total_money(await all_balances(c)) == before - 1_500_000
        await watcher.stop()


async def test_the_banker_cannot_bet_and_bad_requests_are_refused(stack: Stack) -> None:
    table_id = "bb-rules"
    async with connect(stack) as c:
        banker = await new_player(c, f"rbank{stack.run_id}", 10_000_000)
        player = await new_player(c, f"rp{stack.run_id}", 1_000_000)
        await create_table(c, table_id, {"base_score": "10"}, betting_seconds=3)
        await expect_refused(
            c.table.ApplyBanker(table_pb2.ApplyBankerRequest(table_id="gb-none"), metadata=banker.auth),
            grpc.StatusCode.NOT_FOUND,
            "TABLE_NOT_FOUND",
        )
        queue = await apply_banker(c, banker, table_id)
        assert list(queue.chips_minor)[:2] == [1_000, 10_000]
        again = await apply_banker(c, banker, table_id)  # idempotent: in line once, or seated by now
        # (the table may seat a waiting banker between the two calls; then the line is empty).
        assert [e.player for e in again.queue] + ([again.banker] if again.banker else []) == [banker.account]
        watcher = Watcher(c, player, table_id)
        opened = await watcher.wait_for(lambda u: kind(u) == "round_opened" and u.round_opened.banker == banker.account)
        await expect_refused(
            bet(c, banker, table_id, opened.round_id, "b", "heaven", 1_000),
            grpc.StatusCode.FAILED_PRECONDITION,
            "BANKER_CANNOT_BET",
        )
        await expect_refused(
            bet(c, player, table_id, opened.round_id, "c", "heaven", 500),
            grpc.StatusCode.INVALID_ARGUMENT,
            "NOT_A_CHIP_AMOUNT",
        )
        await expect_refused(
            c.table.PlaceBet(
                table_pb2.PlaceBetRequest(
                    command_id="x1", table_id=table_id, area="area_1", amount_minor=1_000, round_id=opened.round_id
                ),
                metadata=player.auth,
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "AREA_UNKNOWN",
        )
        await watcher.stop()


def rigged_deck(hands: dict[str, str]) -> list[str]:
    """A 54-card order whose drawn card is the ace of spades (the banker is dealt first) and deals ``hands``."""
    dealt = {seat: cards.split() for seat, cards in hands.items()}
    order = ["AS"]
    for i in range(25):
        order.append(dealt[bb.SEATS[i % 5]][i // 5])
    return order + [card.code for card in DECK_54 if card.code not in order]


async def test_a_banker_whose_capital_falls_below_the_minimum_loses_the_seat(stack: Stack) -> None:
    """A known deal (test deck): Heaven's Bull Bull beats the banker's No Bull, the bet wins x10."""
    table_id = "bb-broke"
    hands = {
        "banker": "2S 3S 4H 8D 6C",
        "heaven": "KH QH TH 5C 5D",
        "earth": "2H 3H 4D 8C 6D",
        "mystic": "2D 3D 4C 8H 7S",
        "yellow": "2C 3C 4S 9H 7D",
    }
    assert bb.evaluate(parse_cards(hands["heaven"])).category == "bull_bull"
    assert bb.evaluate(parse_cards(hands["banker"])).category == "no_bull"
    async with connect(stack) as c:
        banker = await new_player(c, f"brokebank{stack.run_id}", 1_000_000)
        bettor = await new_player(c, f"brokep{stack.run_id}", 1_000_000)
        await create_table(c, table_id, {"banker.min_capital_minor": "1000000"}, betting_seconds=3)
        await apply_banker(c, banker, table_id)
        watcher = Watcher(c, bettor, table_id)
        opened = await watcher.wait_for(lambda u: kind(u) == "round_opened" and u.round_opened.banker == banker.account)
        async with grpc.aio.insecure_channel(stack.addr("rng")) as channel:
            request = rng_pb2.SetTestDeckRequest(round_id=opened.round_id, cards=rigged_deck(hands))
            await rng_pb2_grpc.RngStub(channel).SetTestDeck(request, metadata=c.admin)
        await bet(c, bettor, table_id, opened.round_id, "h", "heaven", 1_000)
        result = await watcher.wait_for(lambda u: kind(u) == "result" and u.round_id == opened.round_id)
        assert [(b.outcome, b.net_minor) for b in result.result.my_bets] == [("win", 10_000)]
        after = await opened_round(watcher, opened.round_opened.round_no + 1)
        assert after.round_opened.banker == ""  # 990 000 < the table minimum: the tenure ended
        assert (await queue_of(c, table_id)).banker == ""
        await settle_everything(c, [banker, bettor])
        balances = await all_balances(c)
        assert balances[banker.account] == (990_000, 0) and balances[bettor.account] == (1_010_000, 0)
        await watcher.stop()
