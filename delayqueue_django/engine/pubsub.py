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
from collections.abc import Sequence
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
    """A subscription to wake-up channels (one per shard of a queue), confirmed by Redis
    before it is returned, so a publication right after subscribing is never missed. On
    Redis Cluster the channels are classic pub/sub, which every node forwards, so one
    connection hears the shards of every master."""

    def __init__(self, client: Any, channels: Sequence[str]) -> None:
        self._client = client
        self._channels = list(channels)
        self._pubsub = client.pubsub()
        try:
            self._pubsub.subscribe(*self._channels)
            self._confirm()
        except BaseException:
            self._pubsub.close()
            raise
        self._heard_at = time.monotonic()
        self._probe_sent_at: float | None = None

    def _confirm(self) -> None:
        deadline = time.monotonic() + CONFIRM_SECONDS
        unconfirmed = len(self._channels)
        while (remaining := deadline - time.monotonic()) > 0:
            message = self._pubsub.get_message(timeout=remaining)
            if message is not None and message["type"] == "subscribe":
                unconfirmed -= 1
                if not unconfirmed:
                    return
        raise RedisConnectionError("Redis did not confirm the wake-up subscription")

    def wait(self, timeout: float) -> int | None:
        """The due time of the next wake-up within ``timeout`` seconds, or None. Raises
        ConnectionError when the connection is found dead (after closing the client's idle
        connections, which went the same way)."""
        heard = self.wait_on(timeout)
        return None if heard is None else heard[1]

    def wait_on(self, timeout: float) -> tuple[str, int] | None:
        """``wait``, telling on which channel the wake-up came: ``(channel, due_ms)``."""
        try:
            return self._wait(timeout)
        except (RedisConnectionError, RedisTimeoutError):
            drop_idle_connections(self._client)
            raise

    def _wait(self, timeout: float) -> tuple[str, int] | None:
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
                channel = message["channel"]
                channel = channel.decode() if isinstance(channel, bytes) else str(channel)
                due = self._due_time(channel, message["data"])
                if due is not None:
                    return channel, due
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

    def _due_time(self, channel: str, data: Any) -> int | None:
        """The due time a script published, or None (logged) for anything else that was
        published on the channel: it must not stop the subscription."""
        try:
            return int(data)
        except (TypeError, ValueError):
            logger.warning(
                "ignored a message on wake-up channel %s that is not a due time: %.100r",
                channel,
                data,
            )
            return None

    def close(self) -> None:
        self._pubsub.close()
