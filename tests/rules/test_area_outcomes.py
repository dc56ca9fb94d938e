"""The public per-area outcome and the money agree, in every variant under every configuration.

The table publishes ``variant.area_outcomes(hands, config, settlement)`` in ``RoundSettled`` (the
watch stream forwards that map as it is), beside the settlement of the same hands under the same
config. Over random deals, random bets and a random value for every configuration key of every
variant, each bet's recorded outcome is its area's published outcome, and the money it settled
for has that outcome's sign. The one allowed difference is rounding: a win worth less than one
minor unit nets 0, toward the house, with the fraction recorded as the bet's remainder.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import permutations

from hypothesis import given, settings
from hypothesis import strategies as st

from bull.cards import DECK_52, DECK_54, Card, parse_cards
from bull.money import Outcome, Settlement
from bull.variants import VARIANTS, Funding, TableBet

SIGN = {Outcome.WIN: 1, Outcome.HALF_WIN: 1, Outcome.PUSH: 0, Outcome.LOSS: -1}
BANKER = "player:banker"
Round = tuple[dict[str, str], list[Card], list[tuple[str, int]], int]


def text(strategy: st.SearchStrategy[object]) -> st.SearchStrategy[str]:
    return strategy.map(str)


def fractions(low: Fraction, high: Fraction) -> st.SearchStrategy[str]:
    return text(st.fractions(min_value=low, max_value=high, max_denominator=1000))


BOOLS = text(st.sampled_from(["true", "false"]))
MULTIPLIER = fractions(Fraction(1, 1000), Fraction(1000))

KEYS: dict[str, dict[str, st.SearchStrategy[str]]] = {
    "golden_bull": {
        "mode": st.sampled_from(["authentic", "stake_capped"]),
        "suit_order": st.sampled_from(["".join(p) for p in permutations("SHCD")]),
        "suit_tiebreak": BOOLS,
        "exact_tie": st.sampled_from(["dealer", "push"]),
        "commission_bps": text(st.integers(0, 10_000)),
        "bomb_order": st.sampled_from(["rank_of_four", "general"]),
        "multipliers.*": MULTIPLIER,
        "enabled.*": BOOLS,
    },
    "baibian_bull": {
        "bomb_order": st.sampled_from(["general", "rank_of_four"]),
        "deal.card_value": st.sampled_from(["points", "rank"]),
        "base_score": text(st.integers(1, 100)),
        "banker.min_capital_minor": text(st.integers(1, 10**6)),
        "banker.session_rounds": text(st.integers(1, 100)),
        "multipliers.*": MULTIPLIER,
    },
    "bai_buu": {
        "odds": fractions(Fraction(1), Fraction(10)),
        "half_prize": BOOLS,
        "half_prize_points": text(st.integers(0, 9)),
        "jackpot.stake_minor": text(st.integers(1, 10_000)),
        "jackpot.pay.three_of_a_kind": fractions(Fraction(0), Fraction(100)),
        "jackpot.pay.flush": fractions(Fraction(0), Fraction(100)),
        "jackpot.pool_share_bps": text(st.integers(0, 10_000)),
        "jackpot.seed_minor": text(st.integers(0, 10_000)),
        "jackpot.reset_minor": text(st.integers(10_000, 20_000)),  # never below the seed
        "jackpot.split": st.sampled_from(["bets", "hands"]),
        "jackpot.four_of_a_kind_floor": BOOLS,
    },
}


def strategy_for(variant_id: str, key: str) -> st.SearchStrategy[str]:
    keys = KEYS[variant_id]
    return keys[key] if key in keys else keys[key.split(".", 1)[0] + ".*"]


def all_keys(variant_id: str) -> list[str]:
    variant = VARIANTS[variant_id]
    return sorted(variant.config_settings(variant.parse_config({})))


def test_every_configuration_key_of_every_card_variant_is_drawn() -> None:
    """The property below draws a value for every key there is (a new key must join it)."""
    for variant_id in KEYS:
        for key in all_keys(variant_id):
            strategy_for(variant_id, key)  # a KeyError names a key the property would miss


@st.composite
def rounds(draw: st.DrawFn, variant_id: str) -> Round:
    settings_ = {key: draw(strategy_for(variant_id, key)) for key in all_keys(variant_id)}
    variant = VARIANTS[variant_id]
    deck = draw(st.permutations(DECK_54 if variant.deck_size == 54 else DECK_52))
    bets = draw(st.lists(st.tuples(st.sampled_from(variant.areas), st.integers(1, 10**6)), min_size=1, max_size=12))
    pool = draw(st.integers(0, 10**6))
    return settings_, list(deck), bets, pool


def settle_and_publish(
    variant_id: str, settings_: dict[str, str], deck: list[Card], bets: list[tuple[str, int]], pool: int
) -> tuple[Settlement, dict[str, str]]:
    """What the table does at settlement: the variant's settle, then the map RoundSettled publishes."""
    variant = VARIANTS[variant_id]
    config = variant.parse_config(settings_)
    hands = variant.deal(deck, config)
    table_bets = [
        TableBet(f"b{i}", f"player:p{i}", area, variant.fixed_stake_minor(area, config) or stake)
        for i, (area, stake) in enumerate(bets)
    ]
    banked = variant_id == "baibian_bull"
    funding = Funding(BANKER if banked else "", "banker.hold" if banked else "", 10**15, jackpot_pool_minor=pool)
    settlement = variant.settle(hands, table_bets, config, funding)
    return settlement, variant.area_outcomes(hands, config, settlement)


def check_agrees(settlement: Settlement, published: dict[str, str]) -> None:
    rounded = {bet_id for bet_id, _, _ in settlement.remainders}
    for bet in settlement.bets:
        announced = Outcome(published[bet.area])
        assert bet.outcome is announced, (bet, published)
        sign = (bet.net_minor > 0) - (bet.net_minor < 0)
        below_one_unit = SIGN[announced] > 0 and bet.net_minor == 0 and bet.bet_id in rounded
        assert sign == SIGN[announced] or below_one_unit, (bet, published)


@settings(max_examples=150, deadline=None)
@given(rounds("golden_bull"))
def test_golden_bull_publishes_what_its_bets_settle_for(
    drawn: Round,
) -> None:
    check_agrees(*settle_and_publish("golden_bull", *drawn))


@settings(max_examples=150, deadline=None)
@given(rounds("baibian_bull"))
def test_baibian_bull_publishes_what_its_bets_settle_for(
    drawn: Round,
) -> None:
    check_agrees(*settle_and_publish("baibian_bull", *drawn))


@settings(max_examples=150, deadline=None)
@given(rounds("bai_buu"))
def test_bai_buu_publishes_what_its_bets_settle_for(
    drawn: Round,
) -> None:
    check_agrees(*settle_and_publish("bai_buu", *drawn))


def test_red_envelope_bull_publishes_no_area_outcome() -> None:
    """Its one area's bets each hold their own grab: no outcome is every bet's, so none is published."""
    variant = VARIANTS["red_envelope_bull"]
    assert variant.area_outcomes({}, variant.parse_config({})) == {}


def baibian_deck(banker: str, heaven: str) -> list[Card]:
    """A 54-card deck order that deals ``banker`` to the banker and ``heaven`` to Heaven.

    The drawn card is the ace of diamonds (1 point: (1 - 1) % 5 = 0, the banker is dealt first),
    so deck position 1 + i goes to seat i % 5 as its card number i // 5."""
    drawn = parse_cards("AD")
    hands = [parse_cards(banker), parse_cards(heaven)]
    used = {*drawn, *hands[0], *hands[1]}
    rest = iter(card for card in DECK_54 if card not in used)
    seats = [*hands, *([next(rest) for _ in range(5)] for _ in range(3))]
    dealt = [seats[i % 5][i // 5] for i in range(25)]
    return [*drawn, *dealt, *rest]


def test_baibian_rank_of_four_announces_the_loss_its_heaven_bet_pays() -> None:
    """Banker QQQQ3 against Heaven 2222K under ``bomb_order=rank_of_four``: the banker's queens win,
    so Heaven is announced as a loss, the loss of ten times the stake its bet settles for."""
    deck = baibian_deck("QS QH QC QD 3S", "2S 2H 2C 2D KS")
    hands = VARIANTS["baibian_bull"].deal(deck, VARIANTS["baibian_bull"].parse_config({}))
    assert [c.code for c in hands["banker"].cards] == ["QS", "QH", "QC", "QD", "3S"]
    settlement, published = settle_and_publish(
        "baibian_bull", {"bomb_order": "rank_of_four"}, deck, [("heaven", 100)], 0
    )
    assert published["heaven"] == "loss"
    (bet,) = settlement.bets
    assert bet.outcome is Outcome.LOSS and bet.net_minor == -1_000
    # The general rule (the default) reads the highest card instead: Heaven's king wins.
    settlement, published = settle_and_publish("baibian_bull", {}, deck, [("heaven", 100)], 0)
    assert published["heaven"] == "win" and settlement.bets[0].net_minor == 1_000
