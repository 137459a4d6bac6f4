"""``jobfence dashboard``: a small local web page for operators.

It shows, for each backend URL, the locks held (holder, fencing token, time left), the inbox's
claims by state with the stuck ones, and the queues' counts and dead letters; and, for each
scheduler it is given, its schedules with their newest records. Started with
``allow_actions`` it also breaks a lock, forgets an inbox key, purges expired inbox records,
requeues dead letters and pauses, resumes or triggers a schedule. :mod:`.state` gathers the
data and runs the actions (:mod:`.schedules` for the schedulers), :mod:`.server` serves the
page (package data under ``static/``) and the JSON API with the standard library's
``http.server``.
"""

from __future__ import annotations

from .server import DashboardServer, make_server
from .state import Dashboard, DashboardConfig

__all__ = ["Dashboard", "DashboardConfig", "DashboardServer", "make_server"]
