"""The kernel's Variant objects (``bull.variants``): one per game, one registry, settlements that say who funds what."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bull import fairness as fair
from bull.money import SYSTEM_ACCOUNTS
from bull.variants import VARIANTS, EnvelopeSplit, Funding, RoundShape, TableBet, UnknownVariant, get

SHAPES = {
    "golden_bull": RoundShape.HOUSE_DEALER,
    "bai_buu": RoundShape.HOUSE_DEALER,
    "baibian_bull": RoundShape.BANKER_SEAT,
    "red_envelope_bull": RoundShape.BIDDING_DEALER,
}


def test_one_registry_holds_the_four_games_each_with_its_round_shape() -> None:
    assert {v: VARIANTS[v].shape for v in VARIANTS} == SHAPES
    assert get("golden_bull") is VARIANTS["golden_bull"]
    with pytest.raises(UnknownVariant, match="golden_bull"):
        get("poker")


def deal_input(variant_id: str, seed: int, bet_ids: list[str]) -> object:
    variant = VARIANTS[variant_id]
    if variant.deck_size:
        return fair.shuffle(seed.to_bytes(32, "big"), "r1", "", variant.deck_size)
    split = fair.split_envelope(seed.to_bytes(32, "big"), "r1", "", 100_000, len(bet_ids) + 1, 1)
    return EnvelopeSplit(("dealer", *bet_ids), split.amounts, split.grab_order)


@settings(max_examples=60, deadline=None)
@given(
    variant_id=st.sampled_from(sorted(VARIANTS)),
    seed=st.integers(0, 2**64),
    stakes=st.lists(st.integers(1, 50), min_size=1, max_size=6),
    pool=st.integers(0, 200_000),
)
def test_every_transfer_names_a_real_payer_and_the_hold_it_is_paid_from(
    variant_id: str, seed: int, stakes: list[int], pool: int
) -> None:
    variant = VARIANTS[variant_id]
    config = variant.parse_config({})
    pick = random.Random(seed)
    bets = []
    for i, chips in enumerate(stakes):
        area = pick.choice(variant.areas)
        fixed = variant.fixed_stake_minor(area, config)
        bets.append(TableBet(f"b{i}", f"player:p{i}", area, fixed or 100 * chips, f"bet.b{i}"))
    dealer = "" if variant.shape is RoundShape.HOUSE_DEALER else "player:dealer"
    hold = 10**12 if variant.shape is RoundShape.BANKER_SEAT else config.bid_hold_minor(pool) if dealer else 0
    funding = Funding(dealer, "dealer.hold" if dealer else "", hold, pool, jackpot_pool_minor=pool)
    hands = variant.deal(deal_input(variant_id, seed, [b.bet_id for b in bets]), config)  # type: ignore[arg-type]
    if variant.void_reason(hands, config):
        return  # the red-envelope dealer grabbed 0.01: the table voids the round instead
    settlement = variant.settle(hands, bets, config, funding)
    holds = {b.player: b.hold_id for b in bets}
    credited: dict[str, int] = {}
    taken_from_dealer_hold = 0
    for t in settlement.transfers:
        assert t.payer in SYSTEM_ACCOUNTS or t.payer in holds or t.payer == dealer, t  # no rules' placeholder party
        if t.payer in holds:
            assert t.hold_id == holds[t.payer]  # a bettor pays from their bet's hold
        elif t.payer == dealer and t.hold_id:
            assert t.hold_id == "dealer.hold"
            taken_from_dealer_hold += t.amount_minor
        elif t.payer == dealer:  # past the dealer's hold: only from what the round paid the dealer
            assert t.amount_minor <= credited.get(dealer, 0)
            credited[dealer] -= t.amount_minor
        else:
            assert t.hold_id == ""  # the house and the system accounts pay from their balance
        credited[t.payee] = credited.get(t.payee, 0) + t.amount_minor
    assert taken_from_dealer_hold <= hold
    assert sum(settlement.net_by_party().values()) == 0


def test_red_envelope_is_dealt_from_its_split_and_revealed_in_grab_order() -> None:
    variant = VARIANTS["red_envelope_bull"]
    config = variant.parse_config({})
    hands = variant.deal(EnvelopeSplit(("dealer", "b1", "b2"), (342, 111, 547), (1, 2, 0)), config)
    assert variant.reveal_plan(hands) == (("b1", ""), ("b2", ""), ("dealer", ""))
    assert (hands["b2"].category, hands["b2"].amount_minor, hands["dealer"].amount_minor) == ("baozi", 111, 547)
    assert variant.void_reason(hands, config) == ""
    with pytest.raises(TypeError):
        variant.deal(fair.shuffle(bytes(32), "r", "", 52), config)
