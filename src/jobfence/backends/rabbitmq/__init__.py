"""``amqp://`` / ``amqps://``: the queue on RabbitMQ 3.10+ (a quorum queue per jobfence queue,
delays by per-bucket ttl queues, dead letters in a queue of their own).

Modules: ``queue`` (the registry's entry: both classes, each imported on first use),
``queue_aio`` (``AsyncRabbitQueueBackend``, on aio-pika), ``queue_pika``
(``RabbitQueueBackend``, on pika's ``BlockingConnection``), ``common`` (everything both share:
names, arguments, headers, delivery counts, receipts). The sync class never imports aio-pika
and the async one never imports pika. ``pip install 'jobfence[rabbitmq]'``.
"""

from __future__ import annotations

from ..._core.lazy import lazy_attributes

__all__ = ["AsyncRabbitQueueBackend", "RabbitQueueBackend"]

_LAZY = {
    "AsyncRabbitQueueBackend": "queue_aio",
    "RabbitQueueBackend": "queue_pika",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
