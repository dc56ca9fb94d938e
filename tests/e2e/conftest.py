"""The real system as four processes, shared by the end-to-end tests of one module."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from stack import ROOT, Stack


@pytest.fixture(scope="module")
def stack(infra: dict[str, str]) -> Iterator[Stack]:
    run_id = uuid.uuid4().hex[:8]
    system = Stack(run_id, infra, ROOT / ".run" / "e2e" / run_id)
    try:
        system.start_all()
        yield system
    finally:
        system.stop_all()


@pytest.fixture(scope="module")
def log_dir(stack: Stack) -> Path:
    return stack.log_dir
