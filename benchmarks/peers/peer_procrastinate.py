"""procrastinate's app for the worker comparison (PostgreSQL, its own schema PEER_SCHEMA)."""

from __future__ import annotations

import os

import peer_common
import procrastinate

_conninfo = os.environ.get("PEER_BROKER", "postgresql://postgres@127.0.0.1:5432/test")
_schema = os.environ.get("PEER_SCHEMA", "public")
app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        conninfo=_conninfo, kwargs={"options": f"-c search_path={_schema}"}
    )
)


@app.task(name="peer.tick", queue=os.environ.get("PEER_QUEUE", "peer"))
async def tick() -> None:
    await peer_common.atick()
