"""A disposable ``redis-server`` for tests that kill or restart the server.

It listens on a free loopback port, keeps its files in a temporary directory, and persists
nothing (``--save "" --appendonly no``), so :meth:`RedisServer.restart` brings it back on the
same port with its data gone.

``RedisServer(replica_of=port)`` starts a replica of the server on ``port`` (which may be a
``tests.netproxy.FaultProxy`` in front of the primary, to make the replica lag);
:func:`promote` makes a replica a primary (``REPLICAOF NO ONE``), as an operator or a failover
would. :class:`SentinelServer` is a disposable Sentinel watching one primary.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["RedisServer", "SentinelServer", "free_port", "promote", "wait_until"]


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``check`` every 20 ms until it is true; ``RuntimeError`` naming ``what`` after
    ``timeout`` seconds (a server's state has no event to wait on)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def _command(port: int, *args: str, timeout: float = 2.0) -> Any:
    """One command to the server on ``port`` (a fresh connection), its reply decoded."""
    import redis

    client = redis.Redis(port=port, socket_timeout=timeout, decode_responses=True)
    try:
        return client.execute_command(*args)
    finally:
        client.close()


def promote(server: RedisServer) -> None:
    """Make the replica ``server`` a primary with what it has (``REPLICAOF NO ONE``)."""
    _command(server.port, "REPLICAOF", "NO", "ONE")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    def __init__(
        self,
        port: int | None = None,
        *,
        password: str | None = None,
        replica_of: int | None = None,
    ) -> None:
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not on PATH")
        self.port = port or free_port()
        self.password = password
        self.replica_of = replica_of
        self.dir = Path(tempfile.mkdtemp(prefix="jobfence-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [
            "redis-server",
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--daemonize", "no",
            "--loglevel", "warning",
            # a replica gets its first copy at once, not after the default 5 s delay
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        if self.replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    reply = sock.recv(64)
                    if reply.startswith((b"+PONG", b"-NOAUTH")):
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.01)

    def info(self, section: str = "replication") -> dict[str, Any]:
        """``INFO section`` of the server."""
        import redis

        client = redis.Redis(port=self.port, password=self.password, socket_timeout=2)
        try:
            return dict(client.info(section))
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL the server (no shutdown, nothing saved) and wait until it is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> RedisServer:
        """Kill the server and start a fresh one on the same port: every key is gone."""
        self.kill()
        return self.start()

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class SentinelServer:
    """A disposable Sentinel (``redis-server --sentinel``) on a free loopback port watching
    the primary on ``primary_port`` as ``service``, with quorum 1 and short timers: it calls
    the primary down after ``down_after`` ms and promotes a replica."""

    def __init__(self, primary_port: int, *, service: str = "mymaster", down_after: int = 400):
        self.port = free_port()
        self.service = service
        self.dir = Path(tempfile.mkdtemp(prefix="jobfence-sentinel-"))
        self.conf = self.dir / "sentinel.conf"
        self.conf.write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            f"dir {self.dir}\n"
            f"sentinel monitor {service} 127.0.0.1 {primary_port} 1\n"
            f"sentinel down-after-milliseconds {service} {down_after}\n"
            f"sentinel failover-timeout {service} 3000\n"
            f"sentinel parallel-syncs {service} 1\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.port}/{self.service}/0"

    def primary_port(self) -> int:
        """The port of the primary this Sentinel names now."""
        _, port = _command(self.port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        return int(port)

    def replicas(self) -> int:
        """How many replicas of the primary this Sentinel knows."""
        return len(_command(self.port, "SENTINEL", "REPLICAS", self.service))

    def start(self, timeout: float = 10.0) -> SentinelServer:
        self.proc = subprocess.Popen(
            ["redis-server", str(self.conf), "--sentinel", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def answers() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-sentinel exited with {self.proc.returncode}")
            try:
                return bool(_command(self.port, "PING", timeout=0.5))
            except Exception:
                return False

        wait_until(answers, timeout, f"the sentinel on port {self.port}")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SentinelServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
