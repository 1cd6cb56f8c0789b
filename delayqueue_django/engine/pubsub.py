"""Wake-ups from Redis: the scripts publish a due time on the queue's channel whenever work
comes due earlier than sleeping workers planned. Waiting on a subscription costs Redis
nothing; the wait is timed here (Redis's own blocking timeouts are up to 100 ms late)."""

import time
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

# How long subscribing may wait for Redis to confirm the subscription.
CONFIRM_SECONDS = 5.0


class RedisWakeups:
    """A subscription to one wake-up channel, confirmed by Redis before it is returned, so
    a publication right after subscribing is never missed."""

    def __init__(self, client: Any, channel: str) -> None:
        self._pubsub = client.pubsub()
        try:
            self._pubsub.subscribe(channel)
            self._confirm()
        except BaseException:
            self._pubsub.close()
            raise

    def _confirm(self) -> None:
        deadline = time.monotonic() + CONFIRM_SECONDS
        while (remaining := deadline - time.monotonic()) > 0:
            message = self._pubsub.get_message(timeout=remaining)
            if message is not None and message["type"] == "subscribe":
                return
        raise RedisConnectionError("Redis did not confirm the wake-up subscription")

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            message = self._pubsub.get_message(timeout=remaining)
            if message is not None and message["type"] == "message":
                return int(message["data"])
        return None

    def close(self) -> None:
        self._pubsub.close()
