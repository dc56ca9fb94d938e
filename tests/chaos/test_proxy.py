"""The TCP fault proxy against a real echo server on loopback: forwarding, cut, blackhole, delay."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tools.chaos.proxy import FaultProxy

TIMEOUT_S = 5.0


class EchoServer:
    """Echoes every byte back; on the client's end of stream it sends ``BYE`` and closes."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = int(self.sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        conn.settimeout(TIMEOUT_S)
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(65536):
                conn.sendall(data)
            conn.sendall(b"BYE")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(TIMEOUT_S)
        self.sock.close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", echo.port) as fault_proxy:
        yield fault_proxy


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _is_dead(sock: socket.socket) -> bool:
    """True when the connection was reset or closed by the other end."""
    try:
        sock.sendall(b"ping")
        return sock.recv(16) == b""
    except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
        return True


def test_start_picks_a_free_port_and_forwards_both_ways(proxy: FaultProxy, echo: EchoServer) -> None:
    assert proxy.port not in (0, echo.port)
    payload = bytes(range(256)) * 1024  # larger than one chunk
    with _connect(proxy.port) as first, _connect(proxy.port) as second:
        first.sendall(payload)
        second.sendall(b"hello")
        assert _recv_exactly(second, 5) == b"hello"
        assert _recv_exactly(first, len(payload)) == payload


def test_an_orderly_end_passes_through_and_the_reply_after_it_arrives(proxy: FaultProxy) -> None:
    with _connect(proxy.port) as sock:
        sock.sendall(b"last words")
        sock.shutdown(socket.SHUT_WR)
        assert _recv_exactly(sock, len(b"last words") + 3) == b"last wordsBYE"
        assert sock.recv(16) == b""


def _new_connections_are_reset(port: int) -> bool:
    """A new connection is reset: before connect() returns here (a loaded machine) or at its first read."""
    try:
        sock = _connect(port)
    except ConnectionResetError:
        return True
    with sock:
        return _is_dead(sock)


def test_cut_resets_open_connections_and_refuses_new_ones_until_restore(proxy: FaultProxy) -> None:
    with _connect(proxy.port) as before:
        before.sendall(b"x")
        assert _recv_exactly(before, 1) == b"x"
        proxy.cut()
        assert proxy.is_cut
        assert _is_dead(before)
    assert proxy.open_connections == 0

    assert _new_connections_are_reset(proxy.port)

    proxy.restore()
    with _connect(proxy.port) as after:
        after.sendall(b"back")
        assert _recv_exactly(after, 4) == b"back"


def test_blackhole_accepts_but_never_answers_and_restore_resets_the_held(proxy: FaultProxy) -> None:
    proxy.cut(blackhole=True)
    with _connect(proxy.port) as held:
        held.settimeout(0.5)
        held.sendall(b"anyone?")
        with pytest.raises(TimeoutError):
            held.recv(16)
        proxy.restore()
        held.settimeout(TIMEOUT_S)
        assert _is_dead(held)
    with _connect(proxy.port) as after:
        after.sendall(b"ok")
        assert _recv_exactly(after, 2) == b"ok"


def test_delay_adds_latency_in_each_direction_and_zero_removes_it(proxy: FaultProxy) -> None:
    with _connect(proxy.port) as sock:
        proxy.delay(150)
        started = time.monotonic()
        sock.sendall(b"slow")
        assert _recv_exactly(sock, 4) == b"slow"
        # The chunk waited once on the way up and once on the way down: a lower bound only.
        assert time.monotonic() - started >= 0.3
        proxy.delay(0)
        assert proxy.delay_s == 0.0
        sock.sendall(b"fast")
        assert _recv_exactly(sock, 4) == b"fast"
    with pytest.raises(ValueError):
        proxy.delay(-1)


def test_an_unreachable_target_resets_the_client(echo: EchoServer) -> None:
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        dead_port = int(spare.getsockname()[1])  # bound, not listening: connections are refused
        with FaultProxy("127.0.0.1", dead_port, connect_timeout_s=1.0) as proxy:
            assert _new_connections_are_reset(proxy.port)


def test_close_stops_listening_and_drops_connections(echo: EchoServer) -> None:
    proxy = FaultProxy("127.0.0.1", echo.port)
    port = proxy.start()
    sock = _connect(port)
    sock.sendall(b"x")
    assert _recv_exactly(sock, 1) == b"x"
    proxy.close()
    with sock:
        assert _is_dead(sock)
    with pytest.raises(ConnectionRefusedError):
        _connect(port).close()
