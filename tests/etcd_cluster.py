"""Disposable etcd servers for the tests: one member, or a cluster of three, on free loopback
ports, with their data in a temporary directory, stopped (and the directory removed) when the
test process exits or the caller stops them.

``etcd_url()`` is the URL of this process's one-member server, started on first use (one per
pytest-xdist worker). ``EtcdCluster(3)`` starts a cluster whose members a test may kill.
Set ``JOBFENCE_TEST_ETCD_URL`` to use a running server instead.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field

ETCD = os.environ.get("JOBFENCE_TEST_ETCD", shutil.which("etcd") or "/usr/bin/etcd")
#: a quick election on loopback: a leader is elected in well under a second after a failure,
#: and the minimum lease ttl is 1 s (1.5 election timeouts, rounded up)
HEARTBEAT_MS = 50
ELECTION_MS = 500


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (bound at once, then released)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _post(url: str, body: dict[str, object], timeout: float = 1.0) -> dict[str, object]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        answer: dict[str, object] = json.loads(reply.read())
        return answer


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    process: subprocess.Popen[bytes] | None = None
    stopped: bool = False

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def status(self, timeout: float = 1.0) -> dict[str, object]:
        return _post(self.endpoint + "/v3/maintenance/status", {}, timeout)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class EtcdCluster:
    """``size`` etcd members on free loopback ports (started by :meth:`start`)."""

    size: int = 1
    members: list[Member] = field(default_factory=list)
    directory: str = ""

    def start(self, timeout: float = 30.0) -> EtcdCluster:
        # in memory where the host has it: etcd 3.4 has no switch to skip its fsyncs
        shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.directory = tempfile.mkdtemp(prefix="jobfence-etcd-", dir=shm)
        ports = free_ports(2 * self.size)
        self.members = [Member(f"m{i}", ports[2 * i], ports[2 * i + 1]) for i in range(self.size)]
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for m in self.members:
            self._spawn(m, initial)
        atexit.register(self.stop)
        self.wait_ready(timeout)
        return self

    def _spawn(self, m: Member, initial: str) -> None:
        log = open(os.path.join(self.directory, f"{m.name}.log"), "ab")  # noqa: SIM115
        m.process = subprocess.Popen(
            [
                ETCD,
                "--name",
                m.name,
                "--data-dir",
                os.path.join(self.directory, m.name),
                "--listen-client-urls",
                m.endpoint,
                "--advertise-client-urls",
                m.endpoint,
                "--listen-peer-urls",
                m.peer_url,
                "--initial-advertise-peer-urls",
                m.peer_url,
                "--initial-cluster",
                initial,
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                os.path.basename(self.directory),
                "--heartbeat-interval",
                str(HEARTBEAT_MS),
                "--election-timeout",
                str(ELECTION_MS),
                "--log-level",
                "warn",
                "--logger",
                "zap",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    @property
    def url(self) -> str:
        return "etcd://" + ",".join(f"127.0.0.1:{m.client_port}" for m in self.members)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every running member answers and Raft has elected one of them."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.leader() is not None and all(m.status() for m in self.members if m.alive):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not start within {timeout} s: {self.directory}")
            time.sleep(0.05)

    def leader(self) -> Member | None:
        """The member that the running members agree leads, ``None`` if none does now."""
        for m in self.members:
            if not m.alive or m.stopped:
                continue
            try:
                status = m.status(0.5)
            except OSError:
                continue
            header = status.get("header")
            if isinstance(header, dict) and status.get("leader") == header.get("member_id"):
                return m
        return None

    def kill(self, m: Member) -> None:
        """SIGKILL ``m``."""
        if m.process is not None:
            m.process.kill()
            m.process.wait()

    def pause(self, m: Member) -> None:
        if m.process is not None:
            os.kill(m.process.pid, signal.SIGSTOP)
            m.stopped = True

    def resume(self, m: Member) -> None:
        if m.process is not None and m.stopped:
            os.kill(m.process.pid, signal.SIGCONT)
            m.stopped = False

    def stop(self) -> None:
        for m in self.members:
            if m.process is not None and m.process.poll() is None:
                self.resume(m)
                m.process.kill()
                m.process.wait()
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = ""


_SERVER: EtcdCluster | None = None


def etcd_url() -> str:
    """The URL of this process's one-member etcd (started on first use, stopped at exit)."""
    global _SERVER
    configured = os.environ.get("JOBFENCE_TEST_ETCD_URL")
    if configured:
        return configured
    if _SERVER is None:
        _SERVER = EtcdCluster(1).start()
    return _SERVER.url


def delete_etcd_prefix(url: str, prefix: str) -> None:
    """Delete every key starting with ``prefix`` (a test's namespace, percent-encoded as the
    backend encodes it)."""
    import base64
    from urllib.parse import quote

    from jobfence.backends.etcd.keys import range_end

    raw = quote(prefix, safe="").encode()
    endpoint = "http://" + url.split("://", 1)[1].split(",", 1)[0].split("/", 1)[0]
    _post(
        endpoint + "/v3/kv/deleterange",
        {
            "key": base64.b64encode(raw).decode(),
            "range_end": base64.b64encode(range_end(raw)).decode(),
        },
        timeout=5.0,
    )
