"""Red-envelope bull's table pieces: settings, bid steps, the envelope check, paying the dealer's part."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from niuniu.table.v1 import events_pb2 as ev

from bull.rules import red_envelope as re_
from bull.rules.config import ConfigError
from bull.variants import VARIANTS, EnvelopeSplit, Funding, TableBet
from bull.variants.red_envelope_bull import RED_ENVELOPE_BULL, EnvelopeTableConfig
from services.table.common import check_limits
from services.table.core.decide import grab_event
from services.table.core.state import Grab, RoundState

DEALER = "player:dealer"


def net_by_party_of(transfers: list[ev.SettlementTransfer]) -> dict[str, int]:
    nets: dict[str, int] = {}
    for t in transfers:
        nets[t.payer] = nets.get(t.payer, 0) - t.amount_minor
        nets[t.payee] = nets.get(t.payee, 0) + t.amount_minor
    return {party: net for party, net in nets.items() if net}


def test_registered_with_one_area_and_an_18x_hold() -> None:
    assert VARIANTS["red_envelope_bull"] is RED_ENVELOPE_BULL
    config = RED_ENVELOPE_BULL.parse_config({})
    assert RED_ENVELOPE_BULL.areas == ("dealer",)
    assert RED_ENVELOPE_BULL.hold_minor(1_000, config) == 18_000
    assert RED_ENVELOPE_BULL.hold_multiplier(config) == Fraction(18)


def test_settings_round_trip_with_the_seed_defaults() -> None:
    config = EnvelopeTableConfig.from_settings({})
    assert (config.bid_min_minor, config.bid_increment_minor, config.bidding_seconds) == (10_000, 10_000, 18)
    assert EnvelopeTableConfig.from_settings(config.to_settings()) == config
    custom = EnvelopeTableConfig.from_settings({"bidding.increment_minor": "500", "fees.dealer_minor": "30"})
    assert custom.bid_increment_minor == 500 and custom.bid_hold_minor(10_000) == 10_030
    with pytest.raises(ConfigError, match=r"bidding\.seconds"):
        EnvelopeTableConfig.from_settings({"bidding.seconds": "0"})
    with pytest.raises(ConfigError):
        EnvelopeTableConfig.from_settings({"bidding.unknown": "1"})


def test_a_bid_must_beat_the_highest_by_the_increment() -> None:
    config = EnvelopeTableConfig.from_settings({"bidding.min_minor": "5000", "bidding.increment_minor": "10000"})
    assert config.next_bid_minor(0) == 5_000
    assert config.next_bid_minor(5_000) == 15_000
    assert config.next_bid_minor(123_400) == 133_400


def test_the_betting_window_defaults_to_40_seconds_here_only() -> None:
    assert check_limits(RED_ENVELOPE_BULL, ev.TableLimits()).betting_seconds == 40
    assert check_limits(RED_ENVELOPE_BULL, ev.TableLimits(betting_seconds=7)).betting_seconds == 7
    assert check_limits(VARIANTS["golden_bull"], ev.TableLimits()).betting_seconds == 15  # the table default


def test_shares_go_to_seats_and_are_revealed_in_grab_order() -> None:
    config = EnvelopeTableConfig.from_settings({})
    hands = RED_ENVELOPE_BULL.deal(EnvelopeSplit(("dealer", "b1", "b2"), (300, 1, 699), (2, 0, 1)), config)
    assert [(seat, hand.amount_minor) for seat, hand in hands.items()] == [("b2", 300), ("dealer", 1), ("b1", 699)]
    assert RED_ENVELOPE_BULL.reveal_plan(hands) == (("b2", ""), ("dealer", ""), ("b1", ""))
    assert RED_ENVELOPE_BULL.void_reason(hands, config).startswith("DEALER_GRABBED_0.01")


@pytest.mark.parametrize(
    ("amounts", "order", "participants"),
    [
        ([500, 500], [0, 1], 3),  # a share missing
        ([500, 500, 0], [0, 1, 2], 3),  # a share below 0.01
        ([500, 499, 1], [0, 0, 2], 3),  # not a permutation
        ([500, 499, 1], [0, 1], 3),
    ],
)
def test_an_envelope_that_is_not_one_share_each_is_an_error(
    amounts: list[int], order: list[int], participants: int
) -> None:
    seats = ("dealer", *(f"b{i}" for i in range(1, participants)))
    with pytest.raises(ValueError):
        RED_ENVELOPE_BULL.deal(EnvelopeSplit(seats, tuple(amounts), tuple(order)), EnvelopeTableConfig())


def test_a_grab_shows_its_hand() -> None:
    state = RoundState("t", "t-r1", RED_ENVELOPE_BULL.variant_id)
    grabbed = grab_event(state, Grab(0, 2, "player:p", "b1", 111))
    assert (grabbed.amount_text, grabbed.category, grabbed.multiplier, grabbed.dealer) == ("1.11", "baozi", 18, False)
    assert grab_event(state, Grab(1, 0, DEALER, "", 342)).dealer


def round_with(pool: int, dealer_amount: int, bets: list[tuple[int, int]]) -> re_.EnvelopeRound:
    return re_.EnvelopeRound(
        DEALER,
        pool,
        dealer_amount,
        tuple(re_.EnvelopeBet(f"b{i}", f"player:p{i}", stake, amount) for i, (stake, amount) in enumerate(bets)),
    )


def funded_settlement(rnd: re_.EnvelopeRound, config: re_.RedEnvelopeConfig) -> list[ev.SettlementTransfer]:
    """The round settled by the variant, as the table does: the dealer funded from the bid's hold."""
    table_config = EnvelopeTableConfig(rules=config)
    seats = ("dealer", *(b.bet_id for b in rnd.bets))
    amounts = (rnd.dealer_amount_minor, *(b.amount_minor for b in rnd.bets))
    hands = RED_ENVELOPE_BULL.deal(EnvelopeSplit(seats, amounts, tuple(range(len(seats)))), table_config)
    bets = [TableBet(b.bet_id, b.player, "dealer", b.stake_minor, f"bet.{b.bet_id}") for b in rnd.bets]
    funding = Funding(DEALER, "bid.x", table_config.bid_hold_minor(rnd.dealer_pool_minor), rnd.dealer_pool_minor)
    settlement = RED_ENVELOPE_BULL.settle(hands, bets, table_config, funding)
    return [
        ev.SettlementTransfer(
            payer=t.payer,
            payee=t.payee,
            amount_minor=t.amount_minor,
            kind=str(t.kind),
            bet_id=t.bet_id or "",
            hold_id=t.hold_id,
        )
        for t in settlement.transfers
    ]


def test_the_dealer_pays_past_the_pool_only_from_what_losers_paid() -> None:
    fees = {"fees.dealer_minor": "100", "fees.service_minor": "50", "fees.envelope_minor": "20"}
    # The budget counts what the losers paid (with the default, their stakes, B would drink water).
    config = re_.load_config(fees | {"drink_water_base": "paid"})
    # Dealer 3.57 (x5). A loses 1 000 x 5; B's Baozi 700 x 18 = 12 600 is paid: more than the pool of 10 000.
    transfers = funded_settlement(round_with(10_000, 357, [(1_000, 75), (700, 444)]), config)
    from_hold = sum(t.amount_minor for t in transfers if t.payer == DEALER and t.hold_id == "bid.x")
    beyond = [t for t in transfers if t.payer == DEALER and not t.hold_id]
    assert from_hold == 10_170  # the whole hold: pool + fees
    rules = re_.settle(round_with(10_000, 357, [(1_000, 75), (700, 444)]), config)
    dealer_pays = sum(t.amount_minor for t in rules.transfers if t.payer == DEALER)  # commission, 12 600, fees
    assert sum(t.amount_minor for t in beyond) == dealer_pays - 10_170
    assert sum(t.amount_minor for t in beyond) <= 5_000  # within what the loser paid the dealer
    credited = 0
    spent = 0
    for t in transfers:  # the wallet's rule, in order: never more than the credits so far
        if t.payee == DEALER:
            credited += t.amount_minor
        if t.payer == DEALER and not t.hold_id:
            spent += t.amount_minor
            assert spent <= credited
    # Splitting changes no total per (payer, payee, kind, bet).
    assert (
        net_by_party_of(transfers)
        == re_.settle(round_with(10_000, 357, [(1_000, 75), (700, 444)]), config).net_by_party()
    )


@settings(max_examples=300, deadline=None)
@given(
    pool=st.integers(min_value=100, max_value=50_000),
    dealer_amount=st.integers(min_value=2, max_value=2_000),
    bets=st.lists(
        st.tuples(st.integers(min_value=1, max_value=5_000), st.integers(min_value=1, max_value=2_000)),
        min_size=1,
        max_size=8,
    ),
)
def test_every_funded_settlement_is_within_the_holds_and_the_credits(
    pool: int, dealer_amount: int, bets: list[tuple[int, int]]
) -> None:
    config = re_.load_config({"fees.dealer_minor": "100", "fees.service_minor": "50", "fees.envelope_minor": "20"})
    rnd = round_with(pool, dealer_amount, bets)
    transfers = funded_settlement(rnd, config)
    hold = re_.dealer_hold_minor(pool, config)
    assert sum(t.amount_minor for t in transfers if t.hold_id == "bid.x") <= hold
    credited = spent = 0
    for t in transfers:
        if t.payee == DEALER:
            credited += t.amount_minor
        if t.payer == DEALER and not t.hold_id:
            spent += t.amount_minor
            assert spent <= credited
    for i, (stake, _) in enumerate(bets):
        paid = sum(t.amount_minor for t in transfers if t.payer == f"player:p{i}")
        assert paid <= re_.hold_minor(stake, config)
    # The dealer never loses more than the pool plus the fees.
    assert net_by_party_of(transfers).get(DEALER, 0) >= -hold
