"""The ports a tool or a test starts its processes on."""

from __future__ import annotations

import socket
from pathlib import Path

from backbone.localports import LISTEN_PORTS, free_port


def ephemeral_range() -> range:
    low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    return range(low, high + 1)


def test_ports_are_drawn_below_the_kernels_ephemeral_range_never_twice_and_bindable() -> None:
    ephemeral = ephemeral_range()
    drawn = [free_port() for _ in range(50)]
    assert len(set(drawn)) == 50
    for port in drawn:
        assert port in LISTEN_PORTS
        assert port not in ephemeral  # no outgoing connection can take it before it is bound
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_someone_listens_on_is_not_drawn() -> None:
    taken = []
    try:
        for port in range(LISTEN_PORTS.start, LISTEN_PORTS.start + 200):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            s.listen()
            taken.append(s)
        held = {s.getsockname()[1] for s in taken}
        assert not held & {free_port() for _ in range(200)}
    finally:
        for s in taken:
            s.close()
