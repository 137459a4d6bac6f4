"""A disposable PostgreSQL server that asks for a password (``scram-sha-256``) over TCP.

It runs from ``/usr/lib/postgresql/<version>/bin`` in a temporary directory, on a free
loopback port; as root, its files belong to the ``postgres`` user and the server runs as that
user (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from tests.reliability._redis_server import free_port

__all__ = ["ScramPostgres"]


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")
    return Path(found[-1]).parent


class ScramPostgres:
    """``with ScramPostgres(password) as pg:`` -- the superuser ``postgres`` has ``password``,
    and every TCP connection must prove it with SCRAM (``pg.url(...)`` builds URLs)."""

    def __init__(self, password: str) -> None:
        self.password = password
        self.port = free_port()
        self.bin = _bin_dir()
        self.dir = Path(tempfile.mkdtemp(prefix="jobfence-pg-"))
        self.data = self.dir / "data"
        self._as_postgres = os.geteuid() == 0

    def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def url(self, *, password: str | None = None, query: str = "", in_query: bool = False) -> str:
        """A URL for database ``postgres``: the password (this server's unless given) in the
        user-info, or as ``?password=`` with ``in_query``."""
        secret = quote(self.password if password is None else password, safe="")
        if in_query:
            extra = f"password={secret}" + (f"&{query}" if query else "")
            return f"postgresql://postgres@127.0.0.1:{self.port}/postgres?{extra}"
        tail = f"?{query}" if query else ""
        return f"postgresql://postgres:{secret}@127.0.0.1:{self.port}/postgres{tail}"

    def start(self) -> ScramPostgres:
        pwfile = self.dir / "pw"
        pwfile.write_text(self.password + "\n", encoding="utf-8")
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            for path in (self.dir, pwfile):
                os.chown(path, user.pw_uid, user.pw_gid)
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", f"--pwfile={pwfile}",
            "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync",
        )  # fmt: skip
        pwfile.unlink()
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c password_encryption=scram-sha-256"
        )
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"),
                  "-w", "-t", "60", "start")  # fmt: skip
        return self

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ScramPostgres:
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
