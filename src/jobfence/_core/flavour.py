"""``ASYNC``: which flavour of a module this is -- True in the async sources.

The async sources (``*_async.py``) write code that differs between the async module and its
generated sync twin as ``if ASYNC:`` / ``else:`` (or ``if not ASYNC:``) branches, with
``from ._core.flavour import ASYNC`` on an import line of its own. tools/async_to_sync.py
keeps the ``else`` branch, dedented, in the sync twin and drops the async one and the import,
so the twins never read this constant. mypy treats ``ASYNC`` as always true (``always_true``
in pyproject.toml): it checks the async branch in the source and the sync branch in the twin.
"""

ASYNC = True
