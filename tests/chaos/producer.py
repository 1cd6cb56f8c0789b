"""A producer thread sending at a steady rate while a test breaks things, keeping the time
each send was acknowledged (returned) and what the failures were."""

import random
import threading
import time
from collections import Counter

from redis.exceptions import ClusterDownError, ReadOnlyError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayqueue_django.core.outgoing import Outgoing
from delayqueue_django.core.queue import Queue

# Errors that tell the caller the send may not have happened: it knows to send again.
# (BusyLoadingError, Redis loading its AOF, is a ConnectionError.)
EXPECTED_DURING_FAULTS = (
    RedisConnectionError,
    RedisTimeoutError,
    ReadOnlyError,
    ClusterDownError,
    TryAgainError,
)


class Producer(threading.Thread):
    def __init__(
        self,
        queue: Queue,
        *,
        rate: float,
        batch: int = 10,
        max_delay: float = 0.3,
        work_ms: int = 0,
    ) -> None:
        super().__init__(name="chaos-producer", daemon=True)
        self.queue = queue
        self.rate = rate
        self.batch = batch
        self.max_delay = max_delay
        # How long the handler works on each message (see tests.chaos.handlers).
        self.extra = {"work_ms": work_ms} if work_ms else {}
        self.stopping = threading.Event()
        # id -> time.time() when send returned it: the message is acknowledged.
        self.sent: dict[str, float] = {}
        self.failures: Counter[str] = Counter()
        self.unexpected: list[BaseException] = []
        self._rng = random.Random(7)

    def run(self) -> None:
        n = 0
        next_send = time.monotonic()
        while not self.stopping.is_set():
            items = [
                # Half due at once, half after a short delay, to go through pending too.
                Outgoing(
                    {"n": n + i, **self.extra},
                    delay=self._rng.choice((0, self._rng.uniform(0, self.max_delay))),
                )
                for i in range(self.batch)
            ]
            n += self.batch
            try:
                ids = self.queue.send_many(items)
            except EXPECTED_DURING_FAULTS as error:
                self.failures[type(error).__name__] += 1
            except Exception as error:  # anything else is a finding: kept, reported by the test
                self.unexpected.append(error)
            else:
                acknowledged = time.time()
                for message_id in ids:
                    self.sent[message_id] = acknowledged
            next_send += self.batch / self.rate
            self.stopping.wait(max(next_send - time.monotonic(), 0))
            next_send = max(next_send, time.monotonic() - 1)  # no burst to catch up after a fault

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)
