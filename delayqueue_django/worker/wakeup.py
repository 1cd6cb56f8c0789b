"""Listening for wake-ups: the store announces when work comes due earlier than sleeping
workers planned (Redis: the scripts publish on the queue's channel; in memory: a condition
variable), and the listener wakes its consumer."""

import contextlib
import logging
import threading
from collections.abc import Callable

from redis.exceptions import RedisError

from delayqueue_django.engine.protocol import WakeupSubscription
from delayqueue_django.queue import Queue
from delayqueue_django.worker.backoff import Backoff

logger = logging.getLogger("delayqueue_django.worker")


class WakeupListener(threading.Thread):
    def __init__(self, queue: Queue, on_wake: Callable[[], None], stop: threading.Event) -> None:
        super().__init__(name=f"delayqueue-wakeup-{queue.name}", daemon=True)
        self.queue = queue
        self.on_wake = on_wake
        self.stop = stop
        # Set once subscribed, so the first fetch cannot miss a wake-up sent meanwhile.
        self.subscribed = threading.Event()

    def run(self) -> None:
        backoff = Backoff()
        while not self.stop.is_set():
            subscription: WakeupSubscription | None = None
            try:
                subscription = self.queue.store.subscribe_wakeups()
                self.subscribed.set()
                # Anything sent while we were not listening: look again.
                self.on_wake()
                backoff.reset()
                while not self.stop.is_set():
                    if subscription.wait(timeout=1.0) is not None:
                        self.on_wake()
            except (RedisError, OSError) as error:
                if self.stop.is_set():
                    return  # shutting down: a lost connection is expected, not news
                delay = backoff.next()
                logger.warning(
                    "wake-up subscription lost queue=%s: %s; retrying in %.1f s",
                    self.queue.name,
                    error,
                    delay,
                )
                self.stop.wait(delay)
            finally:
                if subscription is not None:
                    with contextlib.suppress(RedisError, OSError):
                        subscription.close()
