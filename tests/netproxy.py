"""A loopback TCP proxy that injects network faults between a client and a real server.

``FaultProxy(target_port)`` listens on a free port of 127.0.0.1 and forwards every connection
to ``127.0.0.1:target_port``. While it runs, a test can:

* ``latency(seconds)`` -- delay every chunk by ``seconds`` in each direction (order kept), so a
  round trip costs twice that;
* ``stall()`` / ``resume()`` -- stop forwarding in both directions (bytes are held, not lost)
  and let them through again: a link that hangs without closing;
* ``reset()`` -- close every open connection at once (the client sees a reset or EOF);
* ``refuse(True)`` -- close new connections as soon as they are accepted.

One thread accepts; each direction of each connection has one forwarding thread. Every socket
operation has a short timeout so ``close()`` always ends the threads; a test uses the proxy as a
context manager. No traffic leaves the loopback interface.
"""

from __future__ import annotations

import heapq
import itertools
import socket
import struct
import threading
import time
from types import TracebackType

__all__ = ["FaultProxy"]

_TICK = 0.02


class _Pipe:
    """One direction of one connection: read from ``src``, hold each chunk until its release
    time (and while stalled), write to ``dst``."""

    def __init__(self, proxy: FaultProxy, src: socket.socket, dst: socket.socket) -> None:
        self.proxy = proxy
        self.src = src
        self.dst = dst
        self.queue: list[tuple[float, int, bytes]] = []
        self.seq = itertools.count()
        self.eof = False
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.writer = threading.Thread(target=self._write, daemon=True)

    def start(self) -> None:
        self.reader.start()
        self.writer.start()

    def _read(self) -> None:
        while not self.proxy.closed:
            try:
                data = self.src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            with self.cond:
                if not data:
                    self.eof = True
                    self.cond.notify_all()
                    return
                # keep order: a chunk never leaves before the one read before it
                due = time.monotonic() + self.proxy.delay
                if self.queue:
                    due = max(due, max(item[0] for item in self.queue))
                heapq.heappush(self.queue, (due, next(self.seq), data))
                self.cond.notify_all()

    def _write(self) -> None:
        while not self.proxy.closed:
            with self.cond:
                if not self.queue:
                    if self.eof:
                        break
                    self.cond.wait(_TICK)
                    continue
                due, _, data = self.queue[0]
                wait = due - time.monotonic()
                if wait > 0 or self.proxy.stalled:
                    self.cond.wait(min(_TICK, wait) if wait > 0 else _TICK)
                    continue
                heapq.heappop(self.queue)
            try:
                self.dst.sendall(data)
            except OSError:
                break
        try:
            self.dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class FaultProxy:
    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.delay = 0.0
        self.stalled = False
        self.refusing = False
        self.closed = False
        self._mutex = threading.Lock()
        self._conns: list[tuple[socket.socket, socket.socket, _Pipe, _Pipe]] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.settimeout(_TICK * 5)
        self.port: int = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    # -- faults ----------------------------------------------------------------------------
    def latency(self, seconds: float) -> None:
        """Delay every chunk by ``seconds`` in each direction from now on."""
        self.delay = seconds

    def stall(self) -> None:
        """Hold every byte in both directions until :meth:`resume` (the link hangs)."""
        self.stalled = True

    def resume(self) -> None:
        self.stalled = False

    def refuse(self, refusing: bool = True) -> None:
        """Close new connections at once (the server looks down)."""
        self.refusing = refusing

    def reset(self) -> None:
        """Close every open connection now."""
        with self._mutex:
            conns, self._conns = self._conns, []
        for client, upstream, _, _ in conns:
            for sock in (client, upstream):
                try:
                    # linger 0: close() sends RST, as a dropped connection would
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
                try:
                    sock.close()
                except OSError:
                    pass

    @property
    def connections(self) -> int:
        with self._mutex:
            return len(self._conns)

    def url_for(self, url: str, port: int) -> str:
        """``url`` with ``127.0.0.1:<port>`` (or ``localhost:<port>``) pointed at this proxy."""
        for host in ("127.0.0.1", "localhost"):
            url = url.replace(f"{host}:{port}", f"127.0.0.1:{self.port}")
        return url

    # -- plumbing --------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.settimeout(_TICK * 5)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            up = _Pipe(self, client, upstream)
            down = _Pipe(self, upstream, client)
            with self._mutex:
                self._conns.append((client, upstream, up, down))
            up.start()
            down.start()

    def close(self) -> None:
        self.closed = True
        self.stalled = False
        try:
            self._listener.close()
        except OSError:
            pass
        self.reset()
        self._acceptor.join(2)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
