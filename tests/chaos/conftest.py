"""The CI chaos run goes in the background as soon as pytest knows it is selected.

``niuniu-chaos`` sized for CI (``test_every_fault_kind_once_and_every_check_passes``) runs on a
Kafka, a PostgreSQL and a Redis of its own and spends most of its ~8 minutes waiting: for a
trigger, for a fault to take effect, for every table to play again. When collection ends with
that test selected, the run starts as a subprocess beside the rest of the suite, and the test is
moved to the end of the session, where it waits for the run and checks its report. Run alone,
the test waits for the whole run as before. If the session ends first, the run is stopped
(SIGTERM: it stops its services and its infrastructure).
"""

from __future__ import annotations

import pytest

from tests.chaos.ci_run import CI_TEST, BackgroundRun, start_ci_run

_run: BackgroundRun | None = None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    chaos = [item for item in items if item.name == CI_TEST]
    items[:] = [item for item in items if item.name != CI_TEST] + chaos


def pytest_collection_finish(session: pytest.Session) -> None:
    global _run
    if _run is None and not session.config.option.collectonly and any(i.name == CI_TEST for i in session.items):
        _run = start_ci_run()


def pytest_sessionfinish() -> None:
    if _run is not None:
        _run.stop()


@pytest.fixture
def ci_chaos_run() -> BackgroundRun:
    """The background run (started when collection ended, or now if it was not)."""
    global _run
    if _run is None:
        _run = start_ci_run()
    return _run
