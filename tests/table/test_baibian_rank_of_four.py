"""百變牛牛 under ``bomb_order=rank_of_four`` through the table: the announced result is the money's.

Banker QQQQ3 against Heaven 2222K: the rank of the four puts the banker's queens above Heaven's
twos, so a bet on Heaven loses ten times its stake, and the round's published per-area outcome
says "loss" for Heaven (it once said "win", read by the default rule while the money used the
table's). Played in process: the real TableApp and store, the fake rng dealing a forced deck.
"""

from __future__ import annotations

import pytest
from psycopg_pool import AsyncConnectionPool

from bull.cards import DECK_54, Card, parse_cards
from bull.money import JACKPOT_POOL
from services.table.common import Phase
from tests.table.table_rig import Rig, player, setup_schema

BALANCES = {f"player:p{i}": 10_000_000 for i in range(6)} | {"house": 0, JACKPOT_POOL: 0}
STAKE_MINOR = 1_000


def banker_against_heaven(banker: str, heaven: str) -> list[str]:
    """A deck order dealing ``banker`` to the banker and ``heaven`` to Heaven: the drawn ace (1 point)
    makes the banker the first seat dealt, so deck position 1 + i goes to seat i % 5 as card i // 5."""
    drawn = parse_cards("AD")
    seats: list[list[Card]] = [list(parse_cards(banker)), list(parse_cards(heaven))]
    rest = iter(card for card in DECK_54 if card not in {*drawn, *seats[0], *seats[1]})
    seats += [[next(rest) for _ in range(5)] for _ in range(3)]
    return [card.code for card in (*drawn, *(seats[i % 5][i // 5] for i in range(25)), *rest)]


@pytest.fixture
async def rig(pool: AsyncConnectionPool) -> Rig:
    return Rig(pool, await setup_schema(pool), BALANCES)


async def test_rank_of_four_queens_beat_twos_in_the_announcement_and_the_money(rig: Rig) -> None:
    await rig.create("r4", "baibian_bull", {"bomb_order": "rank_of_four", "banker.min_capital_minor": "100000"})
    await rig.app.banker.apply(player("p5"), "r4", 1_000_000)
    current = await rig.to_phase("r4", Phase.BETTING)
    rig.rng.forced_decks[current["round_id"]] = banker_against_heaven("QS QH QC QD 3S", "2S 2H 2C 2D KS")
    await rig.app.place_bet(player("p0"), "b0", "r4", "heaven", STAKE_MINOR)
    ended = await rig.finish("r4")
    assert ended["phase"] == Phase.SETTLED
    settled = await rig.settled(current["round_id"])
    assert settled.area_outcomes["heaven"] == "loss"
    paid = [(t.payer, t.payee, t.amount_minor) for t in settled.transfers]
    assert paid == [("player:p0", "player:p5", 10 * STAKE_MINOR)]  # Bomb x10, to the banker
    assert rig.wallet.available["player:p0"] == BALANCES["player:p0"] - 10 * STAKE_MINOR
    assert rig.conserved() and rig.open_holds() == []
