"""Listening for wake-ups: the store announces when work comes due earlier than sleeping
workers planned (Redis: the scripts publish on the queue's channel; in memory: a condition
variable), and the listener wakes its consumer, passing the announced due time on: the
consumer looks then, not at once, when that time is still to come.

The listener never gives up: whatever goes wrong with a subscription (Redis away, a
connection found dead, an error of redis-py's that is not a RedisError), it logs, backs off
and subscribes again, and wakes its consumer once subscribed, for anything sent meanwhile.
While it is not subscribed its consumer looks at the queue on a short period instead.
"""

import contextlib
import logging
import threading
from collections.abc import Callable

from redis.exceptions import RedisError

from delayqueue_django.core.backoff import Backoff
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.errors import is_outage
from delayqueue_django.engine.protocol import WakeupSubscription
from delayqueue_django.worker.outages import Outages

logger = logging.getLogger("delayqueue_django.worker")


class WakeupListener(threading.Thread):
    def __init__(
        self,
        queue: Queue,
        on_wake: Callable[[int | None], None],
        stop: threading.Event,
        outages: Outages,
    ) -> None:
        super().__init__(name=f"delayqueue-wakeup-{queue.name}", daemon=True)
        self.queue = queue
        self.on_wake = on_wake
        self.stop = stop
        self.outages = outages
        # Set while subscribed: wake-ups reach the consumer only then.
        self.subscribed = threading.Event()
        # How many times it subscribed: more than once, a connection was lost and made
        # again (the consumer then reads its schedules again).
        self.subscriptions = 0

    def run(self) -> None:
        try:
            self._listen()
        finally:
            # Ended somehow (not by the stop): the consumer must not sleep on wake-ups that
            # no one hears. It replaces this listener.
            self.subscribed.clear()
            if not self.stop.is_set():
                self.on_wake(None)

    def _listen(self) -> None:
        backoff = Backoff()
        while not self.stop.is_set():
            subscription: WakeupSubscription | None = None
            try:
                subscription = self.queue.store.subscribe_wakeups()
                self.outages.reached(self.queue.address)
                self.subscriptions += 1
                self.subscribed.set()
                # Anything sent while we were not listening: look again.
                self.on_wake(None)
                backoff.reset()
                while not self.stop.is_set():
                    due_ms = subscription.wait(timeout=1.0)
                    if due_ms is not None:
                        # The due time goes along: a consumer need not look before then.
                        self.on_wake(due_ms)
            except Exception as error:
                lost = self.subscribed.is_set()
                self.subscribed.clear()
                if self.stop.is_set():
                    return  # shutting down: a lost connection is expected, not news
                if lost:
                    # Wake-ups go unheard from now on: the consumer looks now, then every
                    # second (once, not at every failed try: it has its own backoff).
                    self.on_wake(None)
                delay = backoff.next()
                if isinstance(error, RedisError | OSError):
                    level = logging.WARNING
                    if is_outage(error):
                        # Said once for the whole worker; each try at debug level.
                        self.outages.failed(self.queue.address, error)
                        level = logging.DEBUG
                    logger.log(
                        level,
                        "wake-up subscription %s queue=%s: %s; subscribing again in %.1f s",
                        "lost" if lost else "failed",
                        self.queue.name,
                        error,
                        delay,
                    )
                else:
                    # Not Redis's word (redis-py's cluster pub/sub raises others, e.g. in a
                    # failover): logged in full, and subscribed again all the same.
                    logger.exception(
                        "unexpected error in the wake-up subscription queue=%s; "
                        "subscribing again in %.1f s",
                        self.queue.name,
                        delay,
                    )
                self.stop.wait(delay)
            finally:
                self.subscribed.clear()
                if subscription is not None:
                    with contextlib.suppress(Exception):
                        subscription.close()
