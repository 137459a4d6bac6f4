"""A disposable three-node Redis Cluster (three primaries, no replicas) on free loopback
ports, its files in a temporary directory, persisting nothing."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

__all__ = ["RedisCluster"]


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_port(taken: list[int]) -> int:
    """A free port whose cluster bus port (10000 higher, so at most 55535) is free too."""
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(20000, 45000)
        if port not in taken and _free(port) and _free(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


class RedisCluster:
    def __init__(self, nodes: int = 3) -> None:
        for tool in ("redis-server", "redis-cli"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} is not on PATH")
        self.ports: list[int] = []
        for _ in range(nodes):
            self.ports.append(cluster_port(self.ports))
        self.dir = Path(tempfile.mkdtemp(prefix="jobfence-cluster-"))
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, timeout: float = 20.0) -> RedisCluster:
        for port in self.ports:
            args = [
                "redis-server",
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--cluster-enabled", "yes",
                "--cluster-config-file", f"nodes-{port}.conf",
                "--cluster-node-timeout", "5000",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.dir),
                "--daemonize", "no",
                "--loglevel", "warning",
            ]  # fmt: skip
            self.procs.append(
                subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
        deadline = time.monotonic() + timeout
        for port in self.ports:
            while not self._answers(port):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {port}")
                time.sleep(0.01)
        subprocess.run(
            ["redis-cli", "--cluster", "create"]
            + [f"127.0.0.1:{port}" for port in self.ports]
            + ["--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=timeout,
        )
        for port in self.ports:  # every node knows every slot's owner
            while b"cluster_state:ok" not in self._command(port, b"CLUSTER INFO"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster node {port} did not reach cluster_state:ok")
                time.sleep(0.02)
        return self

    @staticmethod
    def _command(port: int, command: bytes) -> bytes:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(command + b"\r\n")
                return sock.recv(4096)
        except OSError:
            return b""

    def _answers(self, port: int) -> bool:
        return self._command(port, b"PING").startswith(b"+PONG")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        self.procs = []
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
