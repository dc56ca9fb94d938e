"""The CI chaos run goes last, alone.

``niuniu-chaos`` sized for CI (``test_every_fault_kind_once_and_every_check_passes``) runs on a
Kafka, a PostgreSQL and a Redis of its own for ~8 minutes. It ran in the background beside the
rest of the suite for a while (a256855): the suite was three minutes shorter, but on two cores
the run's faults and recoveries starved the tests beside it, and their seconds-long betting
windows closed on them (three different end-to-end tests failed that way, even with the run at
niceness 10). So the test is moved to the end of the session and starts the run there; if the
session ends first, the run is stopped (SIGTERM: it stops its services and its infrastructure).
"""

from __future__ import annotations

import pytest

from tests.chaos.ci_run import CI_TEST, BackgroundRun, start_ci_run

_run: BackgroundRun | None = None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    chaos = [item for item in items if item.name == CI_TEST]
    items[:] = [item for item in items if item.name != CI_TEST] + chaos


def pytest_sessionfinish() -> None:
    if _run is not None:
        _run.stop()


@pytest.fixture
def ci_chaos_run() -> BackgroundRun:
    """The run, started now (the test comes last)."""
    global _run
    if _run is None:
        _run = start_ci_run()
    return _run
