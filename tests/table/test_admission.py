"""A bet's admission (``admission.verify_bet``), pure: no database, no clock.

The rule is stated here as its specification, condition by condition, and Hypothesis
checks ``verify_bet`` against it on random facts, with the reason it names (the first
condition that fails, in the documented order) and two properties any admission must
have: more staked, or more bets, never turns a refusal into an admission.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from backbone.errors import FailedPrecondition
from services.table.admission import BETTING, BetFacts, Bounds, Order, Refusal, verify_bet

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ROUND = "t-r1"

counts = st.integers(min_value=0, max_value=6)
bounds = st.builds(Bounds, st.integers(min_value=1, max_value=5_000), counts, counts)
facts = st.builds(
    BetFacts,
    phase=st.sampled_from([None, BETTING, "dealing", "revealing", "settled"]),
    closes_at=st.one_of(st.none(), st.integers(min_value=-3, max_value=3).map(lambda s: T0 + timedelta(seconds=s))),
    now=st.just(T0),
    round_id=st.sampled_from([ROUND, "t-r2"]),
    staked_minor=st.integers(min_value=0, max_value=5_000),
    round_bets=counts,
    player_bets=counts,
    player_open_bets=st.integers(min_value=0, max_value=2),
    bounds=bounds,
    one_bet_per_round=st.booleans(),
)
orders = st.builds(Order, st.integers(min_value=1, max_value=3_000), st.sampled_from(["", ROUND, "t-r2"]))


def expected_reasons(f: BetFacts, o: Order) -> list[str]:
    """Every condition the bet fails, in the order the admission checks them."""
    failed = []
    if not (f.phase == BETTING and f.closes_at is not None and f.now < f.closes_at):
        failed.append("BETTING_CLOSED")
    if o.round_id and o.round_id != f.round_id:
        failed.append("ROUND_MISMATCH")
    if f.round_bets >= f.bounds.max_round_bets:
        failed.append("ROUND_FULL")
    if f.player_bets >= f.bounds.max_player_bets:
        failed.append("PLAYER_ROUND_FULL")
    if f.staked_minor + o.amount_minor > f.bounds.max_staked_minor:
        failed.append("ABOVE_TABLE_MAXIMUM")
    if f.one_bet_per_round and f.player_open_bets > 0:
        failed.append("ALREADY_BET")
    return failed


@given(facts, orders)
def test_a_bet_is_taken_exactly_when_every_condition_holds_and_refused_for_the_first_that_fails(
    f: BetFacts, o: Order
) -> None:
    refusal = verify_bet(f, o)
    failed = expected_reasons(f, o)
    if not failed:
        assert refusal is None
    else:
        assert refusal is not None and refusal.reason == failed[0], (refusal, failed)
        assert refusal.message


@given(facts, orders, st.integers(min_value=0, max_value=3), st.integers(min_value=0, max_value=3_000))
def test_more_bets_or_more_staked_never_turn_a_refusal_into_an_admission(
    f: BetFacts, o: Order, more: int, more_minor: int
) -> None:
    busier = replace(
        f,
        staked_minor=f.staked_minor + more_minor,
        round_bets=f.round_bets + more,
        player_bets=f.player_bets + more,
        player_open_bets=f.player_open_bets + more,
    )
    if verify_bet(f, o) is not None:
        assert verify_bet(busier, o) is not None


def test_the_window_closes_at_its_deadline_and_a_refusal_raises_as_a_failed_precondition() -> None:
    open_ = BetFacts(BETTING, T0 + timedelta(milliseconds=1), T0, ROUND, 0, 0, 0, 0, Bounds(1_000, 10, 10))
    assert verify_bet(open_, Order(100)) is None
    at_deadline = replace(open_, closes_at=T0)
    refusal = verify_bet(at_deadline, Order(100))
    assert refusal == Refusal("BETTING_CLOSED", refusal.message if refusal else "")
    error = refusal.error() if refusal else None
    assert isinstance(error, FailedPrecondition) and error.reason == "BETTING_CLOSED"
