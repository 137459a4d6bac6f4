"""Drop-in replacements for other libraries' locks, backed by jobfence.

* :mod:`jobfence.compat.redis_py` -- redis-py's ``Lock`` (``redis.lock(name,
  lock_class=...)``), blocking; :mod:`jobfence.compat.redis_py.asyncio` its asyncio twin.

Nothing here is imported by ``import jobfence``.
"""
