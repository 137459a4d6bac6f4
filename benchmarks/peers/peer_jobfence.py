"""jobfence's handlers for the worker comparison: the same body as a plain function and as a
coroutine function (``jobfence worker peer_jobfence:tick ...``)."""

from __future__ import annotations

from typing import Any

import peer_common


def tick(message: Any) -> None:
    peer_common.tick()


async def atick(message: Any) -> None:
    await peer_common.atick()
