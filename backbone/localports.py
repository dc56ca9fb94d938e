"""Listening ports for processes a tool or a test starts on this machine.

``free_port()`` draws a loopback port nobody listens on, from below Linux's ephemeral range
(32768-60999), and never the same one twice in a process. A port the kernel picks (bind to 0)
comes from the ephemeral range, where an outgoing connection can take it between the draw and
the service's bind: a CI chaos run once failed that way ("Failed to bind to address
127.0.0.1:39999"), and so did a ``niuniu-load`` run ("Address already in use" on a metrics port).
"""

from __future__ import annotations

import random
import socket

LISTEN_PORTS = range(20_000, 32_768)
_drawn: set[int] = set()


def free_port() -> int:
    """A loopback port nobody listens on, not handed out before in this process."""
    for _ in range(1_000):
        port = random.choice(LISTEN_PORTS)
        if port in _drawn:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _drawn.add(port)
        return port
    raise RuntimeError(f"no free port in {LISTEN_PORTS.start}-{LISTEN_PORTS.stop - 1}")
