"""What a caller's client is, read from the module and class names of its type (and its
bases), so that nothing here imports redis-py, psycopg or SQLAlchemy. Which backend serves
each kind is the registry's business (:func:`jobfence.backends.clients.classify`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ClientType", "recognise"]


@dataclass(frozen=True)
class ClientType:
    """``kind``: ``"redis"``, ``"psycopg_pool"``, ``"sqlalchemy"`` or ``"factory"`` (a
    callable returning a connection); whether it is an asyncio client (``None``: not known
    until used); its class name for messages; and, for a SQLAlchemy engine, the name of its
    SQLAlchemy dialect (``"postgresql"``, ``"mysql"``, ``"mariadb"``, ``"sqlite"``, ...)."""

    kind: str
    asynchronous: bool | None
    label: str
    engine_dialect: str = ""


def recognise(client: object) -> ClientType | None:
    """The :class:`ClientType` of ``client``, or ``None`` when it is none of the kinds."""
    for cls in type(client).__mro__:
        module, name = cls.__module__, cls.__name__
        label = f"{module.split('.')[0]}.{name}"
        if module.startswith("redis.") and name in ("Redis", "RedisCluster"):
            asynchronous = module.startswith("redis.asyncio")
            label = ("redis.asyncio." if asynchronous else "redis.") + name
            return ClientType("redis", asynchronous, label)
        if module.startswith("psycopg_pool") and name in ("ConnectionPool", "AsyncConnectionPool"):
            return ClientType("psycopg_pool", name.startswith("Async"), label)
        if module.startswith("sqlalchemy") and name in ("Engine", "AsyncEngine"):
            dialect = str(getattr(getattr(client, "dialect", None), "name", ""))
            return ClientType("sqlalchemy", name == "AsyncEngine", label, dialect)
    if callable(client) and not isinstance(client, type):
        return ClientType("factory", None, "connection factory")
    return None
