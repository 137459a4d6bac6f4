"""The RabbitMQ queue backend classes, as the registry looks them up: ``RabbitQueueBackend``
(blocking, pika) and ``AsyncRabbitQueueBackend`` (asyncio, aio-pika). Each is imported from
its own module on first use, so one flavour never needs the other flavour's driver."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._core.lazy import lazy_attributes

if TYPE_CHECKING:
    from .queue_aio import AsyncRabbitQueueBackend
    from .queue_pika import RabbitQueueBackend

__all__ = ["AsyncRabbitQueueBackend", "RabbitQueueBackend"]

__getattr__ = lazy_attributes(
    __package__ or "jobfence.backends.rabbitmq",
    {"AsyncRabbitQueueBackend": "queue_aio", "RabbitQueueBackend": "queue_pika"},
)
