"""Fixtures for the browser test: the real stack and the gateway serving the built web table."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.frontend_stack import SDK, WEB, Stack, npm_build, running_stack, start_gateway, stop


@pytest.fixture(scope="module")
def stack(infra: dict[str, str]) -> Iterator[Stack]:
    with running_stack(infra, uuid.uuid4().hex[:8]) as system:
        yield system


@pytest.fixture(scope="module")
def web_dist() -> Path:
    """The built web table (clients/web/dist), rebuilt if clients/ changed since."""
    npm_build(SDK)
    npm_build(WEB, SDK / "src")
    return WEB / "dist"


@pytest.fixture(scope="module")
def gateway(stack: Stack, web_dist: Path) -> Iterator[str]:
    """The gateway, serving the web table's files too: the page and the API share one origin."""
    proc, url = start_gateway(stack, NIUNIU_GATEWAY_STATIC_DIR=str(web_dist))
    try:
        yield url
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def web_page(gateway: str) -> str:
    """The web table's address, as scripts/up prints it."""
    return gateway + "/"
