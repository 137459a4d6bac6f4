"""A disposable PostgreSQL server for tests that restart it.

It listens on a free loopback port with its data directory, socket and log in a temporary
directory; ``trust`` authentication for the ``postgres`` user, ``fsync`` off. With
``password=...`` the ``postgres`` superuser has that password and every TCP connection must
prove it with ``scram-sha-256`` (``ScramPostgres``, for the tests of secret masking). It runs
the binaries of ``/usr/lib/postgresql/<version>/bin`` (or of ``$PG_BIN``); as root it runs them
as the ``postgres`` user (``runuser``), which owns the directory.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from tests.reliability._redis_server import free_port

__all__ = ["PostgresServer", "ScramPostgres"]


def _bin_dir() -> Path:
    configured = os.environ.get("PG_BIN")
    if configured:
        return Path(configured)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    if not found:
        raise RuntimeError("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin")
    return Path(found[-1])


class PostgresServer:
    def __init__(self, password: str | None = None, *, max_connections: int = 100) -> None:
        self.password = password
        self.max_connections = max_connections
        self.bin = _bin_dir()
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="jobfence-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.started = False
        self._options = ""

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 60) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(args)} failed: {result.stderr}{result.stdout}{log}")

    def start(self) -> PostgresServer:
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        auth = ["--auth=trust"]
        if self.password is not None:
            pwfile = self.dir / "pw"
            pwfile.write_text(self.password + "\n", encoding="utf-8")
            if os.geteuid() == 0:
                shutil.chown(pwfile, "postgres", "postgres")
            auth = [f"--pwfile={pwfile}", "--auth-local=trust", "--auth-host=scram-sha-256"]
        try:
            self._run("initdb", "-D", str(self.data), "-U", "postgres", *auth, "-E", "UTF8",
                      "--no-sync")  # fmt: skip
        finally:
            (self.dir / "pw").unlink(missing_ok=True)
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c full_page_writes=off -c password_encryption=scram-sha-256 "
            f"-c max_connections={self.max_connections}"
        )
        self._options = options
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.log), "-w", "start")
        self.started = True
        return self

    def crash(self) -> None:
        """``pg_ctl stop -m immediate``: every session dies at once and nothing is shut down
        cleanly (open transactions are lost; the next start runs crash recovery). The data
        directory stays: :meth:`start_again` brings the server back on the same port."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def start_again(self) -> None:
        """Start the server after :meth:`crash`, on the same port and data."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", self._options, "-l", str(self.log), "-w", "start"
        )

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every session is terminated (AdminShutdown), the data
        stays."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-m", "fast", "-l", str(self.log), "-w", "restart"
        )

    def stop(self) -> None:
        if self.started:
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            except RuntimeError:
                pass
            self.started = False
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
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


class ScramPostgres(PostgresServer):
    """``with ScramPostgres(password) as pg:`` -- the superuser ``postgres`` has ``password``,
    and every TCP connection must prove it with SCRAM (``pg.url_with(...)`` builds URLs)."""

    def __init__(self, password: str) -> None:
        super().__init__(password)

    def url_with(
        self, *, password: str | None = None, query: str = "", in_query: bool = False
    ) -> str:
        """A URL for database ``postgres``: the password (this server's unless given) in the
        user-info, or as ``?password=`` with ``in_query``."""
        secret = quote((password if password is not None else self.password) or "", safe="")
        if in_query:
            extra = f"password={secret}" + (f"&{query}" if query else "")
            return f"postgresql://postgres@127.0.0.1:{self.port}/postgres?{extra}"
        tail = f"?{query}" if query else ""
        return f"postgresql://postgres:{secret}@127.0.0.1:{self.port}/postgres{tail}"
