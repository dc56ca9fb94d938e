"""The test vector of docs/fairness.md ("Cancelled and changed bets") against the table's code.

The table combines, when betting closes, the contributions of the bets still placed
(``core.decide.client_seed_of``, which the deal's step asks), and after the deal tells which contributions counted
(``contribution_counted``, ``counted_contributions``: GetRound and ``seed_revealed``).
Both must give the vector's values, and the specification must state them.
"""

from __future__ import annotations

from pathlib import Path

from services.table.common import contribution_counted, counted_contributions
from services.table.core.decide import client_seed_of
from services.table.core.state import Bet, RoundState

SPEC = Path(__file__).resolve().parents[2] / "docs" / "fairness.md"
COMBINED = "a957abbc44428c00c405d6f59e65944b7416f82fc944ae5918a35d39323d6568"
WITH_CANCELLED = "b4e4aa230c1a52aa4008edc26e060393bcbafede14834493d2ea9ab9483021ec"
CANCELLED_AND_PLACED_AGAIN = "30187d6167233dba97467fc39d354177f455f4e2976600819331fc3b30e6b9c8"


def bet(n: int, client_seed: str, status: str, stake_minor: int = 500) -> dict[str, object]:
    return {"bet_id": f"bet-{n}", "client_seed": client_seed, "status": status, "stake_minor": stake_minor}


def round_client_seed(rows: list[dict[str, object]]) -> tuple[str, list[str]]:
    """The client seed (and its contributions) of a round whose bets are ``rows`` when betting closes."""
    bets = tuple(
        Bet(str(b["bet_id"]), "player:p", "banker", int(str(b["stake_minor"])), 0, "", str(b["client_seed"]),
            str(b["status"]))
        for b in rows
    )  # fmt: skip
    return client_seed_of(RoundState("t", "t-r1", "golden_bull", bets=bets))


def at_close() -> list[dict[str, object]]:
    """The vector's bets when betting closes: bet 2 changed (its stake; its contribution stays), 3 cancelled."""
    return [
        bet(1, "alice-42", "placed"),
        bet(2, "b0b", "placed", stake_minor=1_500),
        bet(3, "c4r0l", "cancelled"),
        bet(4, "", "placed"),
    ]


def test_the_vector_at_the_deal() -> None:
    client_seed, contributions = round_client_seed(at_close())
    assert contributions == ["alice-42", "b0b"]
    assert client_seed == COMBINED
    # Had the cancelled bet counted, the seed would differ.
    assert round_client_seed([{**b, "status": "placed"} for b in at_close()])[0] == WITH_CANCELLED


def test_the_vector_after_settlement() -> None:
    """After the deal the placed bets are settled or refunded: what counted is still told apart."""
    settled = [{**b, "status": {"placed": "settled", "cancelled": "cancelled"}[str(b["status"])]} for b in at_close()]
    settled[0]["status"] = "refunded"  # e.g. a bet the settlement's coverage left out: it counted all the same
    assert [contribution_counted(b, COMBINED) for b in settled] == [True, True, False, False]
    assert counted_contributions(settled, COMBINED) == ["alice-42", "b0b"]


def test_a_round_voided_before_its_deal_counted_nothing() -> None:
    refunded = [{**b, "status": "refunded"} for b in at_close()]
    assert counted_contributions(refunded, "") == []
    assert not any(contribution_counted(b, "") for b in refunded)


def test_cancel_and_bet_again_replaces_the_contribution() -> None:
    bets = [
        bet(1, "alice-42", "placed"),
        bet(2, "b0b", "cancelled"),
        bet(5, "b0b-2", "placed"),
    ]
    assert round_client_seed(bets) == (CANCELLED_AND_PLACED_AGAIN, ["alice-42", "b0b-2"])


def test_the_specification_states_the_vector() -> None:
    text = SPEC.read_text()
    section = text[text.index("### Cancelled and changed bets") : text.index("## 11.")]
    for value in (COMBINED, WITH_CANCELLED, CANCELLED_AND_PLACED_AGAIN, "`alice-42`", "`b0b`", "`c4r0l`", "`b0b-2`"):
        assert value in section, value
