"""Wake-ups from Redis: the scripts publish a due time on the queue's channel whenever work
comes due earlier than sleeping workers planned. Waiting on a subscription costs Redis
nothing; the wait is timed here (Redis's own blocking timeouts are up to 100 ms late).

A subscription only ever reads, so a connection that a NAT or firewall dropped silently
would look like a quiet channel forever: after PROBE_AFTER_SECONDS of silence the
subscription PINGs Redis on its own connection, and takes the connection for dead when the
reply does not come within PROBE_REPLY_SECONDS.
"""

import logging
import time
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayqueue_django.engine.pools import drop_idle_connections

logger = logging.getLogger("delayqueue_django.engine")

# How long subscribing may wait for Redis to confirm the subscription.
CONFIRM_SECONDS = 5.0
# A subscription that heard nothing for this long PINGs Redis...
PROBE_AFTER_SECONDS = 3.0
# ...and takes its connection for dead if the reply takes longer than this.
PROBE_REPLY_SECONDS = 3.0


class RedisWakeups:
    """A subscription to one wake-up channel, confirmed by Redis before it is returned, so
    a publication right after subscribing is never missed."""

    def __init__(self, client: Any, channel: str) -> None:
        self._client = client
        self._channel = channel
        self._pubsub = client.pubsub()
        try:
            self._pubsub.subscribe(channel)
            self._confirm()
        except BaseException:
            self._pubsub.close()
            raise
        self._heard_at = time.monotonic()
        self._probe_sent_at: float | None = None

    def _confirm(self) -> None:
        deadline = time.monotonic() + CONFIRM_SECONDS
        while (remaining := deadline - time.monotonic()) > 0:
            message = self._pubsub.get_message(timeout=remaining)
            if message is not None and message["type"] == "subscribe":
                return
        raise RedisConnectionError("Redis did not confirm the wake-up subscription")

    def wait(self, timeout: float) -> int | None:
        """The due time of the next wake-up within ``timeout`` seconds, or None. Raises
        ConnectionError when the connection is found dead (after closing the client's idle
        connections, which went the same way)."""
        try:
            return self._wait(timeout)
        except (RedisConnectionError, RedisTimeoutError):
            drop_idle_connections(self._client)
            raise

    def _wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while (now := time.monotonic()) < deadline:
            until = min(deadline, self._probe(now))
            message = self._pubsub.get_message(timeout=max(until - now, 0.0))
            if message is None:
                continue
            # Anything that arrives shows the connection alive.
            self._heard_at = time.monotonic()
            self._probe_sent_at = None
            if message["type"] == "message":
                due = self._due_time(message["data"])
                if due is not None:
                    return due
        return None

    def _probe(self, now: float) -> float:
        """PING after a silence, raise if the PING went unanswered; returns when to look at
        the probe again."""
        if self._probe_sent_at is None:
            if now - self._heard_at < PROBE_AFTER_SECONDS:
                return self._heard_at + PROBE_AFTER_SECONDS
            self._pubsub.ping()
            self._probe_sent_at = now
        reply_by = self._probe_sent_at + PROBE_REPLY_SECONDS
        if now >= reply_by:
            raise RedisConnectionError(
                f"no reply to a PING on the wake-up subscription within "
                f"{PROBE_REPLY_SECONDS:g} s; taking its connection for dead"
            )
        return reply_by

    def _due_time(self, data: Any) -> int | None:
        """The due time a script published, or None (logged) for anything else that was
        published on the channel: it must not stop the subscription."""
        try:
            return int(data)
        except (TypeError, ValueError):
            logger.warning(
                "ignored a message on wake-up channel %s that is not a due time: %.100r",
                self._channel,
                data,
            )
            return None

    def close(self) -> None:
        self._pubsub.close()
