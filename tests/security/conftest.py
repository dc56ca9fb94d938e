"""The security tests run against the real system: the four services as processes
(tests/e2e/stack.py) on the real Kafka, PostgreSQL and Redis."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

E2E = Path(__file__).resolve().parents[1] / "e2e"
if str(E2E) not in sys.path:
    sys.path.insert(0, str(E2E))

from stack import ROOT, Stack  # noqa: E402  (tests/e2e is on the path from here on)


@pytest.fixture(scope="module")
def stack(infra: dict[str, str]) -> Iterator[Stack]:
    run_id = uuid.uuid4().hex[:8]
    system = Stack(run_id, infra, ROOT / ".run" / "security" / run_id)
    try:
        system.start_all()
        yield system
    finally:
        system.stop_all()


FUZZ_SUMMARY: dict[str, dict[str, int]] = {}
"""Per RPC: generated cases and their status codes, filled by test_fuzz and printed at the end."""


@pytest.fixture(scope="session")
def fuzz_summary() -> dict[str, dict[str, int]]:
    return FUZZ_SUMMARY


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not FUZZ_SUMMARY:
        return
    terminalreporter.section("hostile-input fuzz: generated cases per RPC (boundary sweep + random)")
    totals = {"sweep": 0, "random": 0}
    for rpc, counts in sorted(FUZZ_SUMMARY.items()):
        kinds = {kind: counts.get(kind, 0) for kind in totals}
        for kind, n in kinds.items():
            totals[kind] += n
        codes = {code: n for code, n in counts.items() if code not in totals}
        spread = ", ".join(f"{code} {n}" for code, n in sorted(codes.items(), key=lambda item: -item[1]))
        line = f"{rpc:<30} {sum(kinds.values()):>5} = {kinds['sweep']:>4} + {kinds['random']:>4}  ({spread})"
        terminalreporter.write_line(line)
    cases = sum(totals.values())
    terminalreporter.write_line(
        f"{'total':<30} {cases:>5} = {totals['sweep']:>4} + {totals['random']:>4} over {len(FUZZ_SUMMARY)} RPCs"
    )
