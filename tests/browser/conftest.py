"""Fixtures for the browser test: the real stack, the gateway and the built web table served locally."""

from __future__ import annotations

import functools
import http.server
import threading
import uuid
from collections.abc import Iterator

import pytest

from tests.clients.frontend_stack import SDK, WEB, Stack, npm_build, running_stack, start_gateway, stop


@pytest.fixture(scope="module")
def stack(infra: dict[str, str]) -> Iterator[Stack]:
    with running_stack(infra, uuid.uuid4().hex[:8]) as system:
        yield system


@pytest.fixture(scope="module")
def gateway(stack: Stack) -> Iterator[str]:
    # Development mode: pages on http://127.0.0.1:* may call it (CORS), as the web table's server is.
    proc, url = start_gateway(stack)
    try:
        yield url
    finally:
        stop(proc)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def web_page() -> Iterator[str]:
    """The built web table (clients/web/dist) on a local port; its URL."""
    npm_build(SDK)
    npm_build(WEB, SDK / "src")
    handler = functools.partial(_Quiet, directory=str(WEB / "dist"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
