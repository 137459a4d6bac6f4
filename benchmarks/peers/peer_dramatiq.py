"""Dramatiq's broker and actor for the worker comparison (PEER_BROKER: redis:// or amqp://)."""

from __future__ import annotations

import os

import dramatiq
import peer_common

_url = os.environ.get("PEER_BROKER", "redis://127.0.0.1:6379/0")
if _url.startswith("amqp"):
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    broker: dramatiq.Broker = RabbitmqBroker(url=_url)
else:
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=_url, namespace=os.environ.get("PEER_QUEUE", "peer") + "-ns")
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=os.environ.get("PEER_QUEUE", "peer"), max_retries=0)
def tick() -> None:
    peer_common.tick()
