"""What the operator commands (``jobfence locks``, ``jobfence inbox``) share: where the URL
comes from, the console they print to, and who ran them (for the log of a destructive one)."""

from __future__ import annotations

import getpass
import os
import sys

from rich.console import Console

__all__ = ["NAMESPACE_ENV", "URL_ENV", "console", "user"]

#: where a command finds the backend URL when none is given
URL_ENV = "JOBFENCE_URL"
#: where a command finds the lock namespace when no --namespace is given
NAMESPACE_ENV = "JOBFENCE_NAMESPACE"


def console() -> Console:
    """Rich output on stdout; not on a terminal, tables are not cut to 80 columns."""
    return Console() if sys.stdout.isatty() else Console(width=1000)


def user() -> str:
    """The login name of who runs the command, for the log of what it changed."""
    try:
        return getpass.getuser()
    except Exception:  # no login name (a container without a passwd entry)
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown user"
