"""Rules fidelity end to end: each disputed reading, played through the gRPC API.

Four service processes on the real Kafka, PostgreSQL and Redis; the rng takes test decks and
envelopes (NIUNIU_RNG_TEST_DECKS=1), so every round below is a known deal:

- Golden Bull, ``bomb_order=general``: 5555K (Bull Bull) beats the dealer's QQQQA (bull 1);
  by default (the rank of the four) the same deal loses.
- 百變牛牛: the drawn K counts 10 點 and picks Yellow to be dealt first; two Bombs compare by
  the highest card (the banker's 2222K beats Heaven's QQQQ3).
- Bai Buu: a four of a kind on an empty pool pays the three-of-a-kind prize (the house tops it
  up); with a seed and reset amount the house funds the pool, the sole winning bet takes the
  whole pool although another hand holds four of a kind too, and the pool is reset.
- 68 NiuNiu: the dealer-side commission is 5% of the loser's stake; 喝水 is all or nothing and
  sticky: a winner the pool cannot pay in full, and every weaker winner, gets the stake back.

Each round's result is also recomputed with the rules engine from the round's revealed
record, so the API and ``bull.rules`` agree bet by bet.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import grpc
import pytest
from niuniu.rng.v1 import rng_pb2, rng_pb2_grpc
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from play import (
    TEST_DECKS_ENV,
    Watcher,
    connect,
    env_var,
    kind,
    revealed_round,
    settle_everything,
    verify_round_in_journal,
)
from players import Clients, Player, all_balances, register
from stack import Stack

from bull import money
from bull.cards import DECK_52, DECK_54, parse_cards
from bull.rules import bai_buu, red_envelope
from bull.rules import baibian_bull as bb
from bull.rules import golden_bull as gb
from services.table.common import scoped_id

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def _rng_with_test_decks() -> Iterator[None]:
    """This module's rng takes test decks and envelopes (autouse: set before ``stack`` starts)."""
    with env_var(TEST_DECKS_ENV, "1"):
        yield


# Betting windows long enough for a loaded machine: each round here is a single known deal.
def limits(betting_seconds: int = 8) -> ev.TableLimits:
    return ev.TableLimits(
        min_bet_minor=100,
        max_bet_minor=100_000,
        chips_minor=[100],
        betting_seconds=betting_seconds,
        reveal_interval_ms=5,
        pause_between_rounds_ms=50,
    )


async def create_table(c: Clients, table_id: str, variant: str, config: dict[str, str], betting_s: int = 8) -> None:
    request = table_pb2.CreateTableRequest(table_id=table_id, variant=variant, config=config, limits=limits(betting_s))
    await c.table.CreateTable(request, metadata=c.admin)


async def set_deck(stack: Stack, c: Clients, round_id: str, cards: Sequence[str]) -> None:
    async with grpc.aio.insecure_channel(stack.addr("rng")) as channel:
        request = rng_pb2.SetTestDeckRequest(round_id=round_id, cards=cards)
        await rng_pb2_grpc.RngStub(channel).SetTestDeck(request, metadata=c.admin)


async def set_envelope(stack: Stack, c: Clients, round_id: str, amounts: Sequence[int], order: Sequence[int]) -> None:
    async with grpc.aio.insecure_channel(stack.addr("rng")) as channel:
        request = rng_pb2.SetTestEnvelopeRequest(round_id=round_id, amounts=amounts, grab_order=order)
        await rng_pb2_grpc.RngStub(channel).SetTestEnvelope(request, metadata=c.admin)


async def bet(c: Clients, p: Player, table_id: str, round_id: str, area: str, amount: int) -> None:
    request = table_pb2.PlaceBetRequest(
        command_id=f"{round_id}.{p.name}.{area}", table_id=table_id, area=area, amount_minor=amount, round_id=round_id
    )
    await c.table.PlaceBet(request, metadata=p.auth)


def nets(view: table_pb2.RoundView) -> dict[str, tuple[str, int]]:
    """Bet id (the command id scoped to its player: services.table.common.scoped_id) -> (outcome, net)."""
    return {b.bet_id: (b.outcome, b.net_minor) for b in view.my_bets}


# --------------------------------------------------------------------------- Golden Bull


async def test_golden_bull_bomb_order_is_a_table_setting(stack: Stack) -> None:
    table_id = "rf-golden"
    dealer, area_1 = "QS QH QC QD AS", "5S 5H 5C 5D KS"
    deal = parse_cards(f"{dealer} {area_1} 2S 3S 4S 6S 7S 2H 3H 4H 6H 7H", size=20)
    deck = [card.code for card in (*deal, *(c for c in DECK_52 if c not in deal))]
    general = gb.GoldenBullConfig.from_settings({"bomb_order": "general"})
    default = gb.DEFAULT_CONFIG
    assert gb.compare(gb.evaluate(deal[5:10], general), gb.evaluate(deal[:5], general)) == 1
    assert gb.compare(gb.evaluate(deal[5:10], default), gb.evaluate(deal[:5], default)) == -1
    async with connect(stack) as c:
        player = await register(c, f"rfgold{stack.run_id}", 100_000)
        await set_deck(stack, c, f"{table_id}-r1", deck)
        await create_table(c, table_id, "golden_bull", {"bomb_order": "general"})
        watcher = Watcher(c, player, table_id)
        round_id = (await watcher.wait_for(lambda u: kind(u) == "round_opened")).round_id
        assert round_id == f"{table_id}-r1"
        await bet(c, player, table_id, round_id, "area_1", 1_000)
        view = await revealed_round(c, table_id, round_id, player.auth)
        categories = {h.seat: h.category for h in view.hands}
        assert (categories["area_1"], categories["dealer"]) == ("bomb", "bomb")
        # Bull Bull beats bull 1 once the rank of the four is not compared: +4 000 (area's x4), not -4 000.
        assert nets(view) == {scoped_id(player.account, f"{round_id}.{player.name}.area_1"): ("win", 4_000)}
        await watcher.stop()
        await settle_everything(c, [player])
        assert (await all_balances(c))[player.account] == (104_000, 0)


# --------------------------------------------------------------------------- 百變牛牛


def baibian_deck(drawn: str, first_seat: int, hands: dict[str, str]) -> list[str]:
    """A 54-card order: ``drawn`` first, then the 25 cards round-robin from ``first_seat``."""
    dealt = {seat: cards.split() for seat, cards in hands.items()}
    order = [drawn]
    for i in range(25):
        order.append(dealt[bb.SEATS[(first_seat + i) % 5]][i // 5])
    return order + [card.code for card in DECK_54 if card.code not in order]


async def test_baibian_deal_order_by_points_and_bombs_by_the_highest_card(stack: Stack) -> None:
    table_id = "rf-baibian"
    hands = {
        "banker": "2S 2H 2C 2D KH",
        "heaven": "QS QH QC QD 3S",
        "earth": "4S 5H 6C 8D 9S",
        "mystic": "4H 5C 6D 8S 9H",
        "yellow": "4C 5D 6S 8H 9C",
    }
    assert bb.first_seat(parse_cards("KC")[0]) == 4  # K counts 10 點: (10 - 1) mod 5 = Yellow
    deck = baibian_deck("KC", 4, hands)
    dealt_by_rules = bb.deal(parse_cards(deck, size=54))
    assert dealt_by_rules.first_seat == 4
    assert dealt_by_rules.hands == tuple(parse_cards(hands[seat]) for seat in bb.SEATS)
    async with connect(stack) as c:
        banker = await register(c, f"rfbank{stack.run_id}", 2_000_000)
        bettor = await register(c, f"rfbet{stack.run_id}", 100_000)
        await create_table(c, table_id, "baibian_bull", {})
        await c.table.ApplyBanker(
            table_pb2.ApplyBankerRequest(table_id=table_id, capital_minor=1_000_000), metadata=banker.auth
        )
        watcher = Watcher(c, bettor, table_id)
        opened = await watcher.wait_for(lambda u: kind(u) == "round_opened" and u.round_opened.banker == banker.account)
        await set_deck(stack, c, opened.round_id, deck)
        await bet(c, bettor, table_id, opened.round_id, "heaven", 1_000)
        dealt = await watcher.wait_for(lambda u: kind(u) == "dealt" and u.round_id == opened.round_id)
        assert (dealt.dealt.drawn_card, dealt.dealt.first_seat) == ("KC", "yellow")
        result = await watcher.wait_for(lambda u: kind(u) == "result" and u.round_id == opened.round_id)
        # 2222K beats QQQQ3 by the highest card (K > Q): Heaven loses x10, the banker's Bomb.
        assert [(b.outcome, b.net_minor) for b in result.result.my_bets] == [("loss", -10_000)]
        await c.table.LeaveBanker(table_pb2.LeaveBankerRequest(table_id=table_id), metadata=banker.auth)
        view = await revealed_round(c, table_id, opened.round_id)
        opened_hands = {h.seat: list(h.cards) for h in view.hands if h.group == "open"}
        assert opened_hands == {seat: cards.split() for seat, cards in hands.items()}
        await watcher.stop()
        await settle_everything(c, [banker, bettor])
        balances = await all_balances(c)
        assert balances[bettor.account] == (90_000, 0) and balances[banker.account] == (2_010_000, 0)


# --------------------------------------------------------------------------- Bai Buu

QUADS = ("9S 9H 9C 9D", "2S 2H 2C 2D", "3S 4H 8C JD", "QS QH KC 7C")  # banker and Player 01: four of a kind


def bai_buu_deck(*hands: str) -> list[str]:
    dealt = parse_cards(" ".join(hands), size=4 * len(hands))
    return [card.code for card in (*dealt, *(c for c in DECK_52 if c not in dealt))]


async def jackpot_pool(c: Clients) -> int:
    return (await all_balances(c))[money.JACKPOT_POOL][0]


async def test_bai_buu_jackpot_floor_seed_split_and_reset(stack: Stack) -> None:
    async with connect(stack) as c:
        players = [await register(c, f"rfjack{i}x{stack.run_id}", 10_000) for i in range(2)]
        assert await jackpot_pool(c) == 0
        # 1. An empty pool, no seed: the four of a kind still pays 50 for 1 (the house tops up the 0.10).
        floor_table = "rf-floor"
        await set_deck(stack, c, f"{floor_table}-r1", bai_buu_deck(*QUADS))
        await create_table(c, floor_table, "bai_buu", {})
        watcher = Watcher(c, players[0], floor_table)
        first = (await watcher.wait_for(lambda u: kind(u) == "round_opened")).round_id
        await bet(c, players[0], floor_table, first, "jackpot_banker", 100)
        view = await revealed_round(c, floor_table, first, players[0].auth)
        first_bet = scoped_id(players[0].account, f"{first}.{players[0].name}.jackpot_banker")
        assert nets(view) == {first_bet: ("win", 5_000 - 100)}
        await watcher.stop()
        await settle_everything(c, players)
        assert await jackpot_pool(c) == 0  # the pool's 0.10 was paid out with the house's 49.90
        # 2. A seed of 100.00 and a reset of 150.00: the house funds the pool, the sole winning bet on the
        # banker's four of a kind takes all of it (Player 01's four of a kind has no bet), the pool is reset.
        seeded = "rf-seeded"
        config = {"jackpot.seed_minor": "10000", "jackpot.reset_minor": "15000"}
        await set_deck(stack, c, f"{seeded}-r1", bai_buu_deck(*QUADS))
        await create_table(c, seeded, "bai_buu", config)
        watcher = Watcher(c, players[1], seeded)
        second = (await watcher.wait_for(lambda u: kind(u) == "round_opened")).round_id
        await bet(c, players[1], seeded, second, "jackpot_banker", 100)
        view = await revealed_round(c, seeded, second, players[1].auth)
        second_bet = scoped_id(players[1].account, f"{second}.{players[1].name}.jackpot_banker")
        assert nets(view) == {second_bet: ("win", 10_000 - 100)}
        expected = bai_buu.settle(
            bai_buu.deal_hands([parse_cards(h) for h in QUADS]),
            [],
            [bai_buu.Bet("b", players[1].account, "jackpot_banker", 100)],
            0,
            bai_buu.load_config(config),
        )
        seeds = [t.amount_minor for t in expected.transfers if t.kind is money.TransferKind.JACKPOT_SEED]
        assert seeds == [10_000 - 10, 15_000]  # up to the seed (the pool held this round's 0.10), the reset
        await watcher.stop()
        await settle_everything(c, players)
        assert await jackpot_pool(c) == 15_000
        await verify_round_in_journal(stack, second, recompute=False)  # the journal holds both jackpot_seed moves
        balances = await all_balances(c)
        assert balances[players[0].account] == (14_900, 0) and balances[players[1].account] == (19_900, 0)


# --------------------------------------------------------------------------- 68 NiuNiu


async def test_red_envelope_commission_on_the_stake_and_sticky_drink_water(stack: Stack) -> None:
    table_id = "rf-envelope"
    async with connect(stack) as c:
        dealer = await register(c, f"rfdeal{stack.run_id}", 100_000)
        a = await register(c, f"rfa{stack.run_id}", 100_000)
        b = await register(c, f"rfb{stack.run_id}", 100_000)
        d = await register(c, f"rfd{stack.run_id}", 100_000)
        await create_table(c, table_id, "red_envelope_bull", {"bidding.seconds": "4"}, betting_s=10)
        watcher = Watcher(c, a, table_id)
        round_id = (await watcher.wait_for(lambda u: kind(u) == "round_opened")).round_id
        bid = table_pb2.PlaceBidRequest(
            command_id=f"{round_id}.bid", table_id=table_id, amount_minor=10_000, round_id=round_id
        )
        await c.table.PlaceBid(bid, metadata=dealer.auth)
        await watcher.wait_for(lambda u: kind(u) == "dealer_chosen" and u.round_id == round_id)
        for p, stake in ((a, 1_100), (b, 1_000), (d, 1_000)):  # positions 1, 2, 3 in bet order
            await bet(c, p, table_id, round_id, "dealer", stake)
        # dealer 3.42 (9 points, x9); a 1.11 baozi x18 owed 19 800; b 4.51 Niu Niu x10 owed 10 000; d 0.96 loses
        await set_envelope(stack, c, round_id, [342, 111, 451, 96], [0, 1, 2, 3])
        await watcher.wait_for(lambda u: kind(u) == "result" and u.round_id == round_id)
        view = await revealed_round(c, table_id, round_id)
        by_player = {x.player: (x.outcome, x.net_minor) for x in view.my_bets}
        # d pays 1 000 x 9 = 9 000; the platform takes 5% of d's 10.00 stake (0.50, not 4.50); the budget is
        # the pool plus d's stake, 100.00 + 10.00 = 110.00 < a's 198.00: a drinks water, and so does b although
        # 100.00 would fit.
        assert by_player == {
            a.account: ("drink_water", 0),
            b.account: ("drink_water", 0),
            d.account: ("loss", -9_000 + 7),
        }
        grabs = {g.bet_id: g.amount_minor for g in view.grabs if g.bet_id}
        rnd = red_envelope.EnvelopeRound(
            dealer.account,
            10_000,
            342,
            tuple(red_envelope.EnvelopeBet(x.bet_id, x.player, x.stake_minor, grabs[x.bet_id]) for x in view.my_bets),
        )
        expected = red_envelope.settle(rnd)
        assert {r.player: (str(r.outcome), r.net_minor) for r in expected.bets} == by_player
        party = expected.net_by_party()
        assert party[money.COMMISSION_REVENUE] == 50 and party[dealer.account] == 9_000 - 50
        await watcher.stop()
        await settle_everything(c, [dealer, a, b, d])
        balances = await all_balances(c)
        assert balances[dealer.account] == (100_000 + 8_950, 0) and balances[d.account] == (100_000 - 8_993, 0)
        assert balances[a.account] == balances[b.account] == (100_000, 0)
