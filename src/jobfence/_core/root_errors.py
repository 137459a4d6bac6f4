"""The root of jobfence's errors and :class:`ConfigurationError`, documented and exported as
``jobfence.errors.JobfenceError`` and ``jobfence.errors.ConfigurationError``.

They live in this module, which imports nothing of jobfence, so that the modules every other
one builds on (``_core.clock``, ``_core.hooks``) can raise ``ConfigurationError`` while
``jobfence.errors`` reads the clock: no import cycle. ``__module__`` names their public home,
so tracebacks and pickles say ``jobfence.errors``.
"""

from __future__ import annotations

__all__ = ["ConfigurationError", "JobfenceError"]


class JobfenceError(Exception):
    """Root of every error jobfence raises."""

    __module__ = "jobfence.errors"


class ConfigurationError(JobfenceError, ValueError):
    """A bad URL or argument. ``argument`` names it; the message says what is allowed."""

    __module__ = "jobfence.errors"

    def __init__(self, message: str, *, argument: str | None = None) -> None:
        super().__init__(message)
        self.argument = argument
