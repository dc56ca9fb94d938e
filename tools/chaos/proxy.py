"""A small TCP fault proxy: put it between a client and a server, then cut, restore or slow the link.

``FaultProxy`` listens on ``listen_host:listen_port`` (port 0 picks a free one, read it from
``.port`` after ``start()``) and forwards each accepted connection to ``target_host:target_port``.
Faults:

- ``cut()`` resets every open connection (RST, so the peers see "connection reset" at once
  rather than waiting for a timeout) and resets every new one as soon as it is accepted, like a
  server that went away; ``cut(blackhole=True)`` instead accepts new connections and never
  answers, like a link that drops packets (the client's own timeout has to notice);
- ``restore()`` lets new connections through again (it does not revive cut ones);
- ``delay(ms)`` adds that much latency to every chunk in each direction (0 removes it).

It runs on threads of its own, so synchronous and asynchronous tests and the chaos command can
drive it alike. Every wait is bounded: sockets poll with ``POLL_S`` timeouts so each thread
notices a cut or ``close()`` within that, the upstream connect has ``connect_timeout_s``, and
``cut()``/``close()`` wait at most ``JOIN_S`` for the connection threads to finish.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import struct
import threading
import time
from types import TracebackType

POLL_S = 0.1
JOIN_S = 2.0
CHUNK_BYTES = 65536
# A connection whose peer does not read is given up after this long without progress.
SEND_STALL_S = 30.0

_EOF = b""


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with an RST (SO_LINGER 0) instead of an orderly FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class _Link:
    """One proxied connection: a client socket, an upstream socket and four pump threads.

    Each direction has a reader (recv -> queue with a due time) and a writer (queue -> send once
    due), so added latency delays every chunk without serialising throughput.
    """

    def __init__(self, proxy: FaultProxy, client: socket.socket, upstream: socket.socket) -> None:
        self._proxy = proxy
        self._client = client
        self._upstream = upstream
        self.killed = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        for source, sink, name in ((client, upstream, "up"), (upstream, client, "down")):
            chunks: queue.Queue[tuple[float, bytes]] = queue.Queue()
            self._threads.append(
                threading.Thread(target=self._read, args=(source, chunks), name=f"proxy-{name}-r", daemon=True)
            )
            self._threads.append(
                threading.Thread(target=self._write, args=(sink, chunks), name=f"proxy-{name}-w", daemon=True)
            )
        self._running = len(self._threads)
        for sock in (client, upstream):
            sock.settimeout(POLL_S)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def kill(self) -> None:
        """Stop forwarding; the threads reset both sockets on their way out."""
        self.killed.set()
        for sock in (self._client, self._upstream):
            # SHUT_RD wakes a blocked recv without sending anything; the RST comes at close.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RD)

    def join(self, deadline: float) -> None:
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _read(self, source: socket.socket, chunks: queue.Queue[tuple[float, bytes]]) -> None:
        try:
            while not self.killed.is_set():
                try:
                    data = source.recv(CHUNK_BYTES)
                except TimeoutError:
                    continue
                except OSError:
                    self.kill()  # a reset on one side is passed on as a reset to the other
                    return
                if self.killed.is_set():
                    return
                chunks.put((time.monotonic() + self._proxy.delay_s, data))
                if not data:
                    return
        finally:
            self._thread_done()

    def _write(self, sink: socket.socket, chunks: queue.Queue[tuple[float, bytes]]) -> None:
        try:
            while not self.killed.is_set():
                try:
                    due, data = chunks.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if not self._wait_until(due):
                    return
                if not data:
                    with contextlib.suppress(OSError):
                        sink.shutdown(socket.SHUT_WR)  # pass the orderly end on (half close)
                    return
                if not self._send_all(sink, data):
                    self.kill()
                    return
        finally:
            self._thread_done()

    def _wait_until(self, due: float) -> bool:
        while (left := due - time.monotonic()) > 0:
            if self.killed.wait(min(left, POLL_S)):
                return False
        return not self.killed.is_set()

    def _send_all(self, sink: socket.socket, data: bytes) -> bool:
        view = memoryview(data)
        stalled_since = time.monotonic()
        while view:
            if self.killed.is_set():
                return False
            try:
                sent = sink.send(view)
            except TimeoutError:
                if time.monotonic() - stalled_since > SEND_STALL_S:
                    return False
                continue
            except OSError:
                return False
            view = view[sent:]
            stalled_since = time.monotonic()
        return True

    def _thread_done(self) -> None:
        """The last of the four threads closes both sockets: with an RST if the link was killed."""
        with self._lock:
            self._running -= 1
            if self._running:
                return
        for sock in (self._client, self._upstream):
            if self.killed.is_set():
                _reset(sock)
            else:
                with contextlib.suppress(OSError):
                    sock.close()
        self._proxy._forget(self)


class FaultProxy:
    """A TCP proxy to ``target_host:target_port`` whose link can be cut, restored and slowed."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        *,
        connect_timeout_s: float = 2.0,
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.listen_host = listen_host
        self.port = listen_port
        self.connect_timeout_s = connect_timeout_s
        self.delay_s = 0.0
        self._cut = False
        self._blackhole = False
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._held: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self.accepted = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> int:
        """Start listening and forwarding; returns the listening port (also ``.port``)."""
        if self._listener is not None:
            return self.port
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.listen_host, self.port))
        listener.listen(128)
        listener.settimeout(POLL_S)
        self._listener = listener
        self.port = int(listener.getsockname()[1])
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"proxy-accept-{self.port}", daemon=True)
        self._acceptor.start()
        return self.port

    def close(self) -> None:
        """Stop listening and reset every connection; waits at most ``JOIN_S``."""
        self._closed.set()
        self._drop_all()
        if self._acceptor is not None:
            self._acceptor.join(JOIN_S)
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self.port}"

    # -- faults ------------------------------------------------------------------------------

    def cut(self, *, blackhole: bool = False) -> None:
        """Reset every open connection; refuse (reset) new ones, or with ``blackhole`` hold them silently."""
        with self._lock:
            self._cut = True
            self._blackhole = blackhole
        self._drop_all()

    def restore(self) -> None:
        """Forward new connections again; connections held by a blackhole are reset."""
        with self._lock:
            self._cut = False
            self._blackhole = False
            held, self._held = self._held, []
        for sock in held:
            _reset(sock)

    def delay(self, ms: int) -> None:
        """Add ``ms`` milliseconds of latency to every chunk in each direction (0: none)."""
        if ms < 0:
            raise ValueError("delay must be >= 0 ms")
        self.delay_s = ms / 1000.0

    @property
    def is_cut(self) -> bool:
        return self._cut

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._links)

    # -- internals ---------------------------------------------------------------------------

    def _drop_all(self) -> None:
        with self._lock:
            links = list(self._links)
            held, self._held = (self._held, []) if self._closed.is_set() else ([], self._held)
        for link in links:
            link.kill()
        deadline = time.monotonic() + JOIN_S
        for link in links:
            link.join(deadline)
        for sock in held:
            _reset(sock)

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            with self._lock:
                cut, blackhole = self._cut, self._blackhole
                if cut and blackhole:
                    self._held.append(client)
                    continue
            if cut:
                _reset(client)
                continue
            threading.Thread(target=self._connect, args=(client,), name="proxy-connect", daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection((self.target_host, self.target_port), timeout=self.connect_timeout_s)
        except OSError:
            _reset(client)
            return
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link = _Link(self, client, upstream)
        with self._lock:
            # A cut (or close) between accept and here must not let this connection through.
            if self._cut or self._closed.is_set():
                link.killed.set()
                _reset(client)
                _reset(upstream)
                return
            self._links.add(link)
        link.start()
