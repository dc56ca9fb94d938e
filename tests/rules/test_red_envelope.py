"""Red-envelope bull (68 NiuNiu) rules: the seed's statements, properties, census and math."""

from __future__ import annotations

import itertools
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bull import fairness as fair
from bull import money
from bull.analysis import red_envelope_math as rm
from bull.rules import red_envelope as re_
from bull.rules.config import ConfigError

Outcome = money.Outcome


def ev(text: str) -> re_.EnvelopeHand:
    return re_.evaluate(re_.parse_amount(text))


def beats(a: str, b: str) -> bool:
    return re_.compare(ev(a), ev(b)) == 1 and re_.compare(ev(b), ev(a)) == -1


# ---------------------------------------------------------------------------
# Points and types (seed text)


@pytest.mark.parametrize(
    ("amount", "points"),
    [
        ("RM3.42", 9),  # 3 + 4 + 2 = 9
        ("2.54", 1),  # sum 11 -> 1
        ("9.82", 9),  # sum 19 -> 9
        ("4.51", 10),  # sum 10: ones digit 0 is 10-point Niu Niu
        ("0.01", 1),
        ("12.34", 10),  # 10.00 and more: all digits
    ],
)
def test_points(amount: str, points: int) -> None:
    assert ev(amount).points == points


@pytest.mark.parametrize(
    ("amount", "category", "multiplier"),
    [
        ("1.11", "baozi", 18),
        ("9.99", "baozi", 18),
        ("3.00", "manniu", 15),  # also has equal last digits: the stronger type wins
        ("2.10", "fanshun", 14),
        ("3.21", "fanshun", 14),
        ("1.23", "shunzi", 13),
        ("0.12", "shunzi", 13),
        ("0.88", "duizi", 12),
        ("1.66", "duizi", 12),
        ("0.50", "jinniu", 11),
        ("0.10", "jinniu", 11),
        ("4.51", "points_10", 10),
        ("3.42", "points_9", 9),
        ("2.30", "points_5", 5),
        ("0.01", "points_1", 1),
        ("11.11", "baozi", 18),
        ("12.00", "manniu", 15),
        ("43.21", "fanshun", 14),
        ("12.34", "shunzi", 13),
        ("10.10", "points_2", 2),  # first and last digit 1 and 0: not jinniu
    ],
)
def test_categories_and_multipliers(amount: str, category: str, multiplier: int) -> None:
    hand = ev(amount)
    assert hand.category == category
    assert re_.DEFAULT_CONFIG.multiplier(hand.category) == multiplier


def test_ordinary_multiplier_is_the_points() -> None:
    for n in range(1, 11):
        assert re_.DEFAULT_CONFIG.multiplier(f"points_{n}") == n


def test_type_order() -> None:
    strongest_first = ["1.11", "3.00", "2.10", "1.23", "0.88", "0.50", "4.51", "3.42"]
    for a, b in itertools.pairwise(strongest_first):
        assert beats(a, b), (a, b)


def test_comparison_seed_examples() -> None:
    assert beats("2.30", "1.30")  # 5 points beats 4 points
    assert beats("0.50", "4.51")  # a special type beats Niu Niu: type is checked first
    assert beats("6.21", "3.42")  # same type and points: the larger amount
    assert beats("0.88", "1.66")  # two duizi: 88 beats 66 first (though 6 points > 3 points anyway)
    assert beats("0.99", "3.88")  # 99 beats 88 even with fewer points (8 against 9)
    assert beats("1.88", "0.88")  # equal last two digits: points, 7 beats 6
    assert beats("10.88", "1.88")  # equal digits and points: amount
    assert re_.compare(ev("3.42"), ev("3.42")) == 0  # only equal amounts tie


def test_parse_and_format() -> None:
    assert re_.parse_amount("3.4") == 340
    assert re_.parse_amount(" rm0.05 ") == 5
    assert re_.format_amount(50) == "0.50"
    assert re_.digits(50) == (0, 5, 0)
    for bad in ("0", "0.001", "-1.00", "abc", "1e400"):
        with pytest.raises(re_.AmountError):
            re_.parse_amount(bad)


# ---------------------------------------------------------------------------
# Settlement

CFG = re_.DEFAULT_CONFIG


def bet(bet_id: str, amount: str, stake: int = 1000) -> re_.EnvelopeBet:
    return re_.EnvelopeBet(bet_id, f"player-{bet_id}", stake, re_.parse_amount(amount))


def settle(
    dealer_amount: str, bets: list[re_.EnvelopeBet], pool: int = 10**9, config: re_.RedEnvelopeConfig = CFG
) -> money.Settlement:
    return re_.settle(re_.EnvelopeRound("dealer", pool, re_.parse_amount(dealer_amount), tuple(bets)), config)


def results(s: money.Settlement) -> dict[str, tuple[Outcome, int]]:
    return {b.bet_id: (b.outcome, b.net_minor) for b in s.bets}


def test_win_and_loss_with_commission_and_rebate() -> None:
    s = settle("3.42", [bet("a", "0.88"), bet("b", "2.30")])  # dealer 9 points, x9
    # a wins x12: 120.00 gross, 5% commission 6.00, 0.7% rebate 0.07 -> +114.07
    # b loses x9 (the dealer's multiplier): -90.00 + 0.07 rebate
    assert results(s) == {"a": (Outcome.WIN, 11_407), "b": (Outcome.LOSS, -8_993)}
    net = s.net_by_party()
    # The seed: "the platform takes a 5% cut from that stake": 5% of b's 10.00 stake, not of the 90.00.
    assert net["dealer"] == 9_000 - 50 - 12_000
    assert net[money.COMMISSION_REVENUE] == 600 + 50
    assert net[money.REBATE_EXPENSE] == -14
    kinds = Counter(t.kind for t in s.transfers)
    assert kinds == {
        money.TransferKind.WIN: 1,
        money.TransferKind.LOSS: 1,
        money.TransferKind.COMMISSION: 2,
        money.TransferKind.REBATE: 2,
    }


WIN_BASE = re_.load_config({"commission.dealer_base": "win"})
PAID = re_.load_config({"drink_water_base": "paid"})
WIN_PAID = re_.load_config({"commission.dealer_base": "win", "drink_water_base": "paid"})


def test_dealer_commission_base_stake_or_win() -> None:
    """a 10.00 bet lost to a x12 Duizi costs the dealer 0.50 (stake) or 6.00 (win)."""
    loser = [bet("b", "2.30")]
    by_stake = settle("0.88", loser)
    by_win = settle("0.88", loser, config=WIN_BASE)
    assert results(by_stake) == results(by_win) == {"b": (Outcome.LOSS, -12_000 + 7)}
    assert by_stake.net_by_party()[money.COMMISSION_REVENUE] == 50
    assert by_win.net_by_party()[money.COMMISSION_REVENUE] == 600
    assert re_.DEFAULT_CONFIG.dealer_commission_base == "stake"
    # Rounding toward the house: 5% of a 3.33 stake is 0.1665, the dealer keeps 39.96 - 0.17.
    odd = settle("0.88", [bet("b", "2.30", stake=333)])
    assert odd.net_by_party()["dealer"] == 3_996 - 17
    assert sorted(odd.remainders) == [("b", 3_310, 10_000), ("b", 3_500, 10_000)]  # rebate 2.331, commission
    assert re_.load_config(re_.config_settings(WIN_BASE)) == WIN_BASE


def test_tie_immune_and_void() -> None:
    s = settle("3.42", [bet("tie", "3.42"), bet("immune", "0.01")])
    assert results(s) == {"tie": (Outcome.PUSH, 0), "immune": (Outcome.IMMUNE, 0)}
    assert s.transfers == ()  # no rebate on a tie or 免死
    s = settle("0.01", [bet("a", "1.11"), bet("b", "0.02")], config=re_.load_config({"fees.dealer_minor": 100}))
    assert results(s) == {"a": (Outcome.REFUND, 0), "b": (Outcome.REFUND, 0)}
    assert s.transfers == ()  # a void round charges no fee either


def test_drink_water_strongest_first_and_stop_at_the_first_that_does_not_fit() -> None:
    """With ``drink_water_base=paid`` the budget is the pool plus what the losers paid, net of commission."""
    bets = [bet("niu", "4.51"), bet("baozi", "1.11"), bet("loser", "1.30")]  # dealer 2.30: x5
    # loser pays 50.00, the dealer keeps 47.50 of it (base win). Budget = pool + 47.50.
    s = settle("2.30", bets, pool=6_000, config=WIN_PAID)  # 107.50: baozi (180.00) cannot be paid, nor niu
    assert results(s)["baozi"] == (Outcome.DRINK_WATER, 0)
    assert results(s)["niu"] == (Outcome.DRINK_WATER, 0)
    assert results(s)["loser"] == (Outcome.LOSS, -5_000 + 7)
    s = settle("2.30", bets, pool=14_000, config=WIN_PAID)  # 187.50: baozi paid 180.00, 7.50 left < 100.00
    assert results(s)["baozi"] == (Outcome.WIN, 18_000 - 900 + 7)
    assert results(s)["niu"] == (Outcome.DRINK_WATER, 0)
    s = settle("2.30", bets, pool=23_500, config=WIN_PAID)  # 282.50: both paid
    assert results(s)["niu"] == (Outcome.WIN, 10_000 - 500 + 7)
    assert s.net_by_party()["dealer"] == 4_750 - 28_000
    # Base stake: the dealer keeps 49.50 of the 50.00, so the budget is pool + 49.50.
    s = settle("2.30", bets, pool=23_050, config=PAID)  # 280.00 exactly: both paid
    assert results(s)["niu"] == (Outcome.WIN, 10_000 - 500 + 7)


def test_drink_water_budget_is_the_pool_plus_the_losers_stakes_by_default() -> None:
    """The seed's budget: the pool plus the losers' stakes (10.00 here, not the 49.50 the dealer kept)."""
    bets = [bet("niu", "4.51"), bet("baozi", "1.11"), bet("loser", "1.30")]  # dealer 2.30: x5
    s = settle("2.30", bets, pool=23_050)  # 230.50 + 10.00: baozi paid 180.00, 60.50 < 100.00 for niu
    assert results(s)["baozi"] == (Outcome.WIN, 18_000 - 900 + 7) and results(s)["niu"] == (Outcome.DRINK_WATER, 0)
    s = settle("2.30", bets, pool=27_000)  # 270.00 + 10.00 = 280.00 exactly: both paid
    assert results(s)["niu"] == (Outcome.WIN, 10_000 - 500 + 7)
    # A stake counts no more than the dealer keeps of it: at x1 less 5 %, a 10.00 loser adds 9.50.
    ones = [bet("two", "1.10"), bet("loser", "2.36")]  # dealer 2.45 (1 point, x1); 1.10 is 2 points, x2
    assert results(settle("2.45", ones, pool=1_050))["two"] == (Outcome.WIN, 2_000 - 100 + 7)
    assert results(settle("2.45", ones, pool=1_049))["two"] == (Outcome.DRINK_WATER, 0)
    with pytest.raises(ConfigError) as info:
        re_.load_config({"drink_water_base": "won"})
    assert info.value.key == "drink_water_base"


def test_drink_water_all_or_nothing_and_the_two_alternatives() -> None:
    """a winner owed 180.00 against 179.99 of budget; a weaker winner the rest would cover."""
    bets = [bet("baozi", "1.11"), bet("two", "1.10")]  # dealer 2.45 (1 point, x1): baozi x18, 1.10 x2
    stop = settle("2.45", bets, pool=17_999)
    assert results(stop) == {"baozi": (Outcome.DRINK_WATER, 0), "two": (Outcome.DRINK_WATER, 0)}
    assert stop.transfers == ()
    skip = settle("2.45", bets, pool=17_999, config=re_.load_config({"drink_water": "skip"}))
    assert results(skip) == {"baozi": (Outcome.DRINK_WATER, 0), "two": (Outcome.WIN, 2_000 - 100 + 7)}
    partial = settle("2.45", bets, pool=17_999, config=re_.load_config({"drink_water": "partial"}))
    # baozi gets all 179.99 (less 5%: keeps floor(170.9905) = 170.99), then the pool is empty: two drinks water.
    assert results(partial) == {"baozi": (Outcome.WIN, 17_099 + 7), "two": (Outcome.DRINK_WATER, 0)}
    assert partial.net_by_party()["dealer"] == -17_999
    with pytest.raises(ConfigError) as info:
        re_.load_config({"drink_water": "sometimes"})
    assert info.value.key == "drink_water"


@pytest.mark.parametrize("budget", re_.DRINK_WATER_BASES)
@pytest.mark.parametrize("rule", re_.DRINK_WATER_RULES)
@pytest.mark.parametrize("base", re_.DEALER_COMMISSION_BASES)
def test_vectorised_settlement_matches_settle_for_every_rule(rule: str, base: str, budget: str) -> None:
    config = re_.load_config({"drink_water": rule, "commission.dealer_base": base, "drink_water_base": budget})
    rng = np.random.default_rng(7)
    split = rm.double_mean_split(rng, 1000, 6, 400)
    for pool in (0, 3_000, 20_000):
        nets = rm.settle_vectorised(split, 1000, pool, config)
        for row in range(len(split)):
            if split[row, 0] == re_.VOID_AMOUNT_MINOR:
                continue
            bets = tuple(re_.EnvelopeBet(f"b{i}", f"p{i}", 1000, int(a)) for i, a in enumerate(split[row, 1:]))
            s = re_.settle(re_.EnvelopeRound("dealer", pool, int(split[row, 0]), bets), config)
            assert [b.net_minor for b in s.bets] == [int(v) for v in nets.player_net[row]]
            assert [b.outcome is Outcome.DRINK_WATER for b in s.bets] == list(nets.drink_water[row])


def test_equal_winners_are_paid_in_bet_order() -> None:
    bets = [bet("first", "4.51"), bet("second", "4.51")]
    s = settle("2.30", bets, pool=10_000)
    assert results(s) == {"first": (Outcome.WIN, 9_507), "second": (Outcome.DRINK_WATER, 0)}


def test_fees_are_separate_transfers_from_the_dealer() -> None:
    config = re_.load_config({"fees.dealer_minor": 100, "fees.service_minor": 20, "fees.envelope_minor": 5})
    s = settle("3.42", [bet("a", "3.42")], config=config)
    fees = [(t.payer, t.payee, t.amount_minor, t.kind) for t in s.transfers]
    assert fees == [
        ("dealer", money.FEES, 100, money.TransferKind.DEALER_FEE),
        ("dealer", money.FEES, 20, money.TransferKind.SERVICE_FEE),
        ("dealer", money.FEES, 5, money.TransferKind.ENVELOPE_FEE),
    ]
    assert re_.dealer_hold_minor(50_000, config) == 50_125


def test_rounding_goes_to_the_house_and_is_recorded() -> None:
    s = settle("3.42", [bet("a", "0.88", stake=333)])  # gross 333 x 12 = 3 996
    # keeps floor(3 996 x 0.95) = 3 796 (exact 3 796.2), rebate floor(2.331) = 2
    assert results(s) == {"a": (Outcome.WIN, 3_796 + 2)}
    assert sorted(s.remainders) == [("a", 2_000, 10_000), ("a", 3_310, 10_000)]


def test_holds() -> None:
    assert re_.hold_minor(1000) == 18_000
    assert re_.hold_minor(1000, re_.load_config({"multipliers.duizi": 20})) == 20_000


def test_round_validation() -> None:
    with pytest.raises(re_.BetError):
        settle("3.42", [bet("a", "1.00"), re_.EnvelopeBet("b", "player-a", 100, 200)])
    with pytest.raises(re_.BetError):
        re_.settle(re_.EnvelopeRound("dealer", 0, 342, (re_.EnvelopeBet("a", "dealer", 100, 200),)))
    with pytest.raises(re_.BetError):
        settle("3.42", [re_.EnvelopeBet("a", "p", 0, 200)])
    with pytest.raises(re_.AmountError):
        settle("3.42", [re_.EnvelopeBet("a", "p", 10, 0)])


def test_config_defaults_and_errors() -> None:
    config = re_.load_config({})
    assert config == re_.DEFAULT_CONFIG
    assert (config.dealer_commission_bps, config.player_commission_bps, config.rebate_bps) == (500, 500, 70)
    assert config.max_multiplier == 18
    changed = re_.load_config({"multipliers": {"baozi": 20}, "rebate_bps": "0"})
    assert changed.multiplier("baozi") == 20 and changed.rebate_bps == 0
    assert re_.load_config(re_.config_settings(changed)) == changed
    for key, value in [
        ("multipliers.baozi", "0"),
        ("multipliers.points_3", "x"),
        ("commission.dealer_bps", "10001"),
        ("rebate_bps", "-1"),
        ("fees.service_minor", "1.5"),
        ("envelope.total_minor", "1"),
        ("multipliers.tianwang", "5"),
    ]:
        with pytest.raises(ConfigError) as info:
            re_.load_config({key: value})
        assert info.value.key == key


# ---------------------------------------------------------------------------
# Properties

amounts = st.integers(1, 99_999)


@given(amounts, amounts, amounts)
@settings(max_examples=500, deadline=None)
def test_compare_is_a_total_order_consistent_with_categories(a: int, b: int, c: int) -> None:
    ha, hb, hc = re_.evaluate(a), re_.evaluate(b), re_.evaluate(c)
    assert re_.compare(ha, hb) == -re_.compare(hb, ha)
    assert (re_.compare(ha, hb) == 0) == (a == b)
    if re_.compare(ha, hb) >= 0 and re_.compare(hb, hc) >= 0:
        assert re_.compare(ha, hc) >= 0
    rank = {cat: i for i, cat in enumerate(re_.CATEGORIES)}  # strongest first
    if rank[ha.category] < rank[hb.category]:
        assert re_.compare(ha, hb) == 1
    if ha.category == hb.category and ha.category != "duizi" and ha.points != hb.points:
        assert re_.compare(ha, hb) == (1 if ha.points > hb.points else -1)


configs = st.builds(
    re_.RedEnvelopeConfig,
    multipliers=st.tuples(*(st.tuples(st.just(c), st.integers(1, 30)) for c in re_.CATEGORIES)),
    dealer_commission_bps=st.integers(0, 10_000),
    player_commission_bps=st.integers(0, 10_000),
    rebate_bps=st.integers(0, 10_000),
    dealer_fee_minor=st.integers(0, 1000),
    service_fee_minor=st.integers(0, 1000),
    envelope_fee_minor=st.integers(0, 1000),
)


@st.composite
def rounds(draw: st.DrawFn) -> tuple[re_.EnvelopeRound, re_.RedEnvelopeConfig]:
    small = st.one_of(st.integers(1, 30), st.integers(1, 2_000))  # small amounts: 0.01s and ties happen
    n = draw(st.integers(0, 8))
    bets = tuple(re_.EnvelopeBet(f"b{i}", f"p{i}", draw(st.integers(1, 10**6)), draw(small)) for i in range(n))
    pool = draw(st.one_of(st.integers(0, 10**5), st.integers(0, 10**10)))
    return re_.EnvelopeRound("dealer", pool, draw(small), bets), draw(configs)


@given(rounds())
@settings(max_examples=400, deadline=None)
def test_settlement_conserves_money_and_caps_the_dealer(case: tuple[re_.EnvelopeRound, re_.RedEnvelopeConfig]) -> None:
    rnd, config = case
    s = re_.settle(rnd, config).check()
    net = s.net_by_party()
    assert sum(net.values()) == 0
    paid_out = sum(t.amount_minor for t in s.transfers if t.kind is money.TransferKind.WIN)
    paid_in = sum(t.amount_minor for t in s.transfers if t.kind is money.TransferKind.LOSS)
    assert paid_out <= rnd.dealer_pool_minor + paid_in
    assert net.get("dealer", 0) >= -re_.dealer_hold_minor(rnd.dealer_pool_minor, config)
    for b in s.bets:
        assert -b.net_minor <= b.hold_minor == re_.hold_minor(b.stake_minor, config)
    # Winners are paid strongest first: every paid winner beats (or equals) every one drinking water.
    by_id = {b.bet_id: b for b in rnd.bets}
    paid = [re_.evaluate(by_id[b.bet_id].amount_minor) for b in s.bets if b.outcome is Outcome.WIN]
    dry = [re_.evaluate(by_id[b.bet_id].amount_minor) for b in s.bets if b.outcome is Outcome.DRINK_WATER]
    assert all(re_.compare(p, d) >= 0 for p in paid for d in dry)
    if rnd.dealer_amount_minor == re_.VOID_AMOUNT_MINOR:
        assert s.transfers == () and all(b.outcome is Outcome.REFUND for b in s.bets)


def test_vectorised_settlement_matches_settle() -> None:
    rng = np.random.default_rng(11)
    config = re_.load_config({"fees.dealer_minor": 30, "rebate_bps": 75})
    for participants, total, pool in [(2, 300, None), (4, 500, 2_000), (6, 1000, 15_000), (9, 60, None)]:
        split = rm.double_mean_split(rng, total, participants, 300)
        nets = rm.settle_vectorised(split, 997, pool, config)
        for i, row in enumerate(split.tolist()):
            bets = tuple(re_.EnvelopeBet(f"b{j}", f"p{j}", 997, a) for j, a in enumerate(row[1:]))
            rnd = re_.EnvelopeRound("dealer", 10**15 if pool is None else pool, row[0], bets)
            s = re_.settle(rnd, config)
            assert [b.net_minor for b in s.bets] == nets.player_net[i].tolist()
            assert s.net_by_party().get("dealer", 0) == nets.dealer_net[i]


def test_double_mean_split_matches_the_rng_service() -> None:
    rng = np.random.default_rng(3)
    split = rm.double_mean_split(rng, 1000, 5, 4000)
    assert (split.sum(axis=1) == 1000).all() and split.min() >= 1
    service = np.array(
        [fair.split_envelope(bytes([i % 256]) * 32, f"r{i}", "", 1000, 5, 1).by_position for i in range(4000)]
    )
    for stat in (np.max, np.min):
        ours, theirs = stat(split, axis=1), stat(service, axis=1)
        se = np.sqrt(ours.var() / len(ours) + theirs.var() / len(theirs))
        assert abs(ours.mean() - theirs.mean()) < 5 * se


def test_exact_two_player_rtp_against_settle() -> None:
    config = re_.load_config({"envelope.total_minor": 250})
    total = 0
    for d in range(2, 250):
        s = re_.settle(re_.EnvelopeRound("dealer", 10**12, d, (re_.EnvelopeBet("b", "p", 1000, 250 - d),)), config)
        total += s.bets[0].net_minor
    assert rm.exact_two_player_rtp(config, 1000) == 1 + Fraction(total, 1000 * 248)


def test_simulation_agrees_with_the_exact_two_player_figure() -> None:
    est = rm.simulate(np.random.default_rng(1), re_.DEFAULT_CONFIG, 2, 40_000)
    exact = float(rm.exact_two_player_rtp(re_.DEFAULT_CONFIG))
    half = (est.ci95[1] - est.ci95[0]) / 2
    assert abs(est.rtp - exact) < 2 * half  # 2 half-widths, about 4 standard errors
    assert est.ci95[0] < est.rtp < est.ci95[1]


def test_without_commission_the_game_is_exactly_fair() -> None:
    """Each envelope settled with every share as the dealer's nets to zero (the report's claim)."""
    gross = re_.load_config({"commission.dealer_bps": 0, "commission.player_bps": 0, "rebate_bps": 0})
    est = rm.simulate(np.random.default_rng(2), gross, 4, 3_000, stake_minor=100)
    assert abs(est.rtp - 1) < 1e-12 and abs(est.dealer_return) < 1e-12


# ---------------------------------------------------------------------------
# Census against an independent derivation


def test_census_of_every_amount_below_ten() -> None:
    census = rm.census()
    assert sum(census.values()) == 999
    baozi = [111 * d for d in range(1, 10)]
    manniu = [100 * d for d in range(1, 10)]
    fanshun = [100 * d + 10 * (d - 1) + (d - 2) for d in range(2, 10)]
    shunzi = [100 * d + 10 * (d + 1) + (d + 2) for d in range(0, 8)]
    jinniu = [10 * d for d in range(1, 10)]
    # duizi: last two digits equal, minus what a stronger type takes
    duizi = [100 * a + 11 * b for a in range(10) for b in range(10) if 100 * a + 11 * b not in {0, *baozi, *manniu}]
    specials = {
        "baozi": baozi,
        "manniu": manniu,
        "fanshun": fanshun,
        "shunzi": shunzi,
        "duizi": duizi,
        "jinniu": jinniu,
    }
    assert {k: len(v) for k, v in specials.items()} == {
        "baozi": 9,
        "manniu": 9,
        "fanshun": 8,
        "shunzi": 8,
        "duizi": 81,
        "jinniu": 9,
    }
    taken = set(itertools.chain.from_iterable(specials.values()))
    assert len(taken) == 124  # the six lists are disjoint
    # Points of the rest from the digit-sum distribution of three digits (a convolution).
    by_sum = Counter(a + b + c for a in range(10) for b in range(10) for c in range(10))
    by_points = Counter[int]()
    for total, count in by_sum.items():
        by_points[total % 10 or 10] += count
    by_points[10] -= 1  # 0.00 is not an amount
    for amount in taken:
        s = amount // 100 + amount // 10 % 10 + amount % 10
        by_points[s % 10 or 10] -= 1
    expected = {k: len(v) for k, v in specials.items()} | {f"points_{p}": by_points[p] for p in range(10, 0, -1)}
    assert census == expected
