"""Kombu's Redis transport, with the guard that lets a worker ride out a Redis restart.

Celery's consumer, on losing the broker, first ``collect()``s the connection (closing
its channels and then detaching the transport from the connection: ``client = None``)
and then ``close()``s it. When closing a channel was cut short by the dead socket (the
BRPOP it was blocked in raises), the second close runs it again, and the channel tries
to give back the messages it holds unacknowledged (countdown tasks waiting in the worker,
late-acked tasks running) over a fresh connection pool built from a client that is gone:
``AttributeError: 'NoneType' object has no attribute 'hostname'``, "Unrecoverable error",
and the worker exits (kombu 5.7, celery 5.7; celery/kombu#582 is the same failure).

Here a pool asked for after the transport was detached raises a connection error
instead, which Celery handles as what it is (a lost broker: reconnect and carry on). The
messages it could not give back are still in Redis's ``unacked`` hash, restored after the
visibility timeout; detection does not wait for them (``backend.detection.schedule``).

Used by every distributed process through ``broker_transport``
(:func:`backend.celery_app.configure`).
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> Any:
        if self.connection.client is None:
            raise RedisConnectionError("the broker connection was closed (lost broker)")
        return super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]


class Transport(kombu_redis.Transport):
    Channel = Channel
