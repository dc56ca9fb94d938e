"""The pure round core runs at least 1 000 Hypothesis steps per variant, without PostgreSQL
(``round_core_machine.py`` states the invariants each step keeps); and the rng's refusal and a void,
which the live machines send it, decide as they do."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from niuniu.table.v1 import events_pb2 as ev

from bull.variants import VARIANTS
from services.table.core.commands import RngFailed, Void
from services.table.core.decide import ENVELOPE_ERROR, RNG_DOWN, RNG_PATIENCE_MS, decide
from services.table.core.evolve import evolve
from services.table.core.state import Phase, RoundState
from tests.table.round_core_machine import machine_for

STEPS_PER_VARIANT = 1_000


@pytest.mark.parametrize("variant_id", sorted(VARIANTS))
def test_round_core_keeps_its_invariants(variant_id: str) -> None:
    machine = machine_for(variant_id)
    budget = settings(
        max_examples=45,
        stateful_step_count=30,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    run_state_machine_as_test(machine, settings=budget)
    assert machine.steps >= STEPS_PER_VARIANT, f"{variant_id}: only {machine.steps} steps ran"


CLOSED_MS = 1_000_000


@pytest.mark.parametrize(("variant_id", "voids_now"), [("golden_bull", False), ("red_envelope_bull", True)])
def test_an_rng_refusal_voids_an_envelope_at_once_and_a_deal_only_past_the_patience(
    variant_id: str, voids_now: bool
) -> None:
    state = RoundState("t", "t-r1", variant_id, phase=Phase.DEALING, betting_closes_at_ms=CLOSED_MS)
    soon, late = CLOSED_MS + RNG_PATIENCE_MS - 1, CLOSED_MS + RNG_PATIENCE_MS
    assert decide(state, RngFailed(), soon) == []
    refused = decide(state, RngFailed(refused=True), soon)
    assert [e.reason for e in refused if isinstance(e, ev.RoundVoided)] == ([ENVELOPE_ERROR] if voids_now else [])
    (voided,) = decide(state, RngFailed(), late)
    assert isinstance(voided, ev.RoundVoided) and voided.reason == (ENVELOPE_ERROR if voids_now else RNG_DOWN)


def test_a_void_ends_a_round_in_play_and_leaves_an_ended_one() -> None:
    state = RoundState("t", "t-r1", "bai_buu", phase=Phase.DEALING, betting_closes_at_ms=CLOSED_MS)
    (voided,) = decide(state, Void("CLOSED: the table is closed"), 0)
    assert isinstance(voided, ev.RoundVoided) and voided.reason == "CLOSED: the table is closed"
    assert decide(evolve(state, voided), Void("again"), 0) == []
