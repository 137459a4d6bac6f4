# Generated from renewal_async.py by tools/async_to_sync.py: do not edit.
# Edit the async source and run: python tools/async_to_sync.py
"""The lease renewer's former home: ``AsyncRenewer`` (here) and ``Renewer``
(``jobfence.renewal``, generated from it) live in ``jobfence._core.renewer_async`` and
``jobfence._core.renewer`` and are re-exported here, with the renewer's constants, so the old
import paths keep working.
"""

from __future__ import annotations

from ._core.renewer import BATCH_WINDOW as BATCH_WINDOW
from ._core.renewer import IDLE_WAIT as IDLE_WAIT
from ._core.renewer import RESTART_PAUSE as RESTART_PAUSE
from ._core.renewer import WARN_EVERY as WARN_EVERY
from ._core.renewer import Renewer

__all__ = ["Renewer"]
