"""The lease renewer's former home: ``AsyncRenewer`` (here) and ``Renewer``
(``jobfence.renewal``, generated from it) live in ``jobfence._core.renewer_async`` and
``jobfence._core.renewer`` and are re-exported here, with the renewer's constants, so the old
import paths keep working.
"""

from __future__ import annotations

from ._core.renewer_async import BATCH_WINDOW as BATCH_WINDOW
from ._core.renewer_async import IDLE_WAIT as IDLE_WAIT
from ._core.renewer_async import RESTART_PAUSE as RESTART_PAUSE
from ._core.renewer_async import WARN_EVERY as WARN_EVERY
from ._core.renewer_async import AsyncRenewer

__all__ = ["AsyncRenewer"]
