"""Fixtures for the TypeScript SDK's tests: the real stack with the browser gateway in front."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.clients.frontend_stack import Stack, running_stack, start_gateway, stop


@pytest.fixture(scope="module")
def stack(infra: dict[str, str]) -> Iterator[Stack]:
    with running_stack(infra, uuid.uuid4().hex[:8]) as system:
        yield system


@pytest.fixture(scope="module")
def gateway(stack: Stack) -> Iterator[str]:
    proc, url = start_gateway(stack)
    try:
        yield url
    finally:
        stop(proc)
