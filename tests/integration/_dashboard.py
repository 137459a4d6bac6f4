"""A real ``jobfence dashboard`` process for the tests: started, its address read from the line
it prints, stopped with SIGTERM; what it logged is kept for the test to read."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "jobfence dashboard: "


@dataclass
class Running:
    """A dashboard process: its ``base`` address (``http://127.0.0.1:PORT``) and ``port``."""

    base: str
    port: int
    process: subprocess.Popen[str]
    log_path: Path

    def log(self) -> str:
        """What the process wrote to stderr so far."""
        return self.log_path.read_text()

    def request(
        self,
        path: str,
        *,
        body: Any = None,
        headers: dict[str, str] | None = None,
        method: str | None = None,
    ) -> tuple[int, Any]:
        """``(status, decoded JSON)`` of one request (``body`` as JSON when not bytes)."""
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base + path, data=data, headers=headers or {}, method=method
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def token(self) -> str:
        """The action token, as the page carries it."""
        with urllib.request.urlopen(self.base + "/", timeout=30) as response:
            page = response.read().decode()
        marker = '<meta name="jobfence-token" content="'
        start = page.index(marker) + len(marker)
        return page[start : page.index('"', start)]


def program() -> Path:
    path = Path(sys.executable).with_name("jobfence")
    assert path.exists(), f"the jobfence console script is not installed at {path}"
    return path


@contextmanager
def dashboard(
    *args: str,
    tmp_path: Path,
    env: dict[str, str] | None = None,
    page: Any = None,
    cwd: Path | None = None,
) -> Iterator[Running]:
    """Run ``jobfence dashboard ARGS --port 0`` until the block ends, in ``cwd`` (where
    ``--scheduler MODULE:OBJ`` finds its module). ``page``: a browser page
    showing this dashboard, taken off it before the server stops (else its next refresh logs a
    refused connection, which the browser tests count as a page error)."""
    log_path = tmp_path / f"dashboard-{len(list(tmp_path.glob('dashboard-*')))}.log"
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [str(program()), "dashboard", *args, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
            env=env,
            cwd=cwd,
        )
    try:
        assert process.stdout is not None
        with ThreadPoolExecutor(1) as pool:
            line = pool.submit(process.stdout.readline).result(timeout=60)
        assert line.startswith(PREFIX), f"{line!r}; stderr: {log_path.read_text()}"
        base = line[len(PREFIX) :].strip().rstrip("/")
        yield Running(
            base=base, port=int(base.rsplit(":", 1)[1]), process=process, log_path=log_path
        )
    finally:
        if page is not None:
            page.goto("about:blank")
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
