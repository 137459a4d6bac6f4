"""RabbitMQ checks of ``jobfence doctor``: the broker's version (from the connection's server
properties) and the round trip of a channel request. AMQP has no clock query, so the clock
offset is unknown; RabbitMQ serves queues only, so there is no probe lease."""

from __future__ import annotations

from typing import Any

import pika

from ..._core.url import BackendURL
from ...doctor import Report, Timer
from .common import read_settings


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def inspect(report: Report, url: BackendURL, timer: Timer) -> None:
    s = read_settings(url, {}, queue="jobfence-doctor")
    params = pika.ConnectionParameters(
        host=s.host,
        port=s.port,
        virtual_host=s.vhost,
        credentials=pika.PlainCredentials(s.username, s.password),
        socket_timeout=s.timeouts.connect,
        stack_timeout=s.timeouts.connect,
        blocked_connection_timeout=s.timeouts.request,
        connection_attempts=1,
        ssl_options=pika.SSLOptions(s.tls, s.host) if s.tls is not None else None,
        client_properties={"connection_name": "jobfence doctor"},
    )
    connection = pika.BlockingConnection(params)
    try:
        props = connection._impl.server_properties or {}
        product = _text(props.get("product", "RabbitMQ"))
        report.server_version = f"{product} {_text(props.get('version', '?'))}"
        channel = connection.channel()
        report.rtt_ms = timer.ping(lambda: channel.basic_qos(prefetch_count=1))
        channel.close()
    finally:
        connection.close()
    report.clock_note = "unknown: AMQP has no clock query"
    report.add("ok", "rabbitmq-version", report.server_version)
    report.add(
        "ok",
        "rabbitmq-queues",
        "RabbitMQ serves queues only (no probe lease); listing queues needs the management "
        "API: pass the queue names to `jobfence queue stats`",
    )
