"""The real system as four processes, shared by the end-to-end tests of one module."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from stack import Stack, running_stack


@pytest.fixture(scope="module")
def stack(infra: dict[str, str]) -> Iterator[Stack]:
    with running_stack(infra, uuid.uuid4().hex[:8]) as system:
        yield system


@pytest.fixture(scope="module")
def log_dir(stack: Stack) -> Path:
    return stack.log_dir
