"""The fault-injecting TCP proxy the reliability tests use, against a loopback echo server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.netproxy import FaultProxy


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(2)
    server.close()


def _roundtrip(port: int, payload: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def test_forwards_bytes_in_order(echo_port: int) -> None:
    payload = bytes(range(256)) * 512
    with FaultProxy(echo_port) as proxy:
        assert _roundtrip(proxy.port, payload) == payload


def test_latency_delays_each_direction(echo_port: int) -> None:
    with FaultProxy(echo_port) as proxy:
        proxy.latency(0.1)
        started = time.monotonic()
        assert _roundtrip(proxy.port, b"ping") == b"ping"
        # one round trip crosses the proxy twice: at least two delays
        assert time.monotonic() - started >= 0.2


def test_stall_holds_bytes_until_resume(echo_port: int) -> None:
    with (
        FaultProxy(echo_port) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock,
    ):
        proxy.stall()
        sock.sendall(b"held")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(16)
        proxy.resume()
        sock.settimeout(5)
        assert sock.recv(16) == b"held"


def test_reset_drops_open_connections_and_refuse_turns_new_ones_away(echo_port: int) -> None:
    with FaultProxy(echo_port) as proxy:
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        assert _roundtrip(proxy.port, b"x") == b"x"
        proxy.reset()
        with pytest.raises(OSError):  # reset, or EOF then a failed send
            sock.sendall(b"after")
            if not sock.recv(16):
                raise ConnectionResetError
        sock.close()
        proxy.refuse()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as late:
            late.settimeout(5)
            try:
                assert late.recv(16) == b""
            except ConnectionResetError:
                pass
