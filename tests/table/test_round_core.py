"""The pure round core runs at least 1 000 Hypothesis steps per variant, without PostgreSQL
(``round_core_machine.py`` states the invariants each step keeps)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from bull.variants import VARIANTS
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
