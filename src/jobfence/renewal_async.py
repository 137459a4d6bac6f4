"""The lease renewer's former home: ``AsyncRenewer`` (here) and ``Renewer``
(``jobfence.renewal``, generated from it) live in ``jobfence._core.renewer_async`` and
``jobfence._core.renewer`` and are re-exported here, so the old import paths keep working.
"""

from __future__ import annotations

from ._core.renewer_async import AsyncRenewer

__all__ = ["AsyncRenewer"]
