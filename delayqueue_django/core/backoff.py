"""Exponential backoff with jitter, for reconnecting to Redis."""

import random


class Backoff:
    def __init__(self, first: float = 0.1, limit: float = 5.0) -> None:
        self.first = first
        self.limit = limit
        self._current = first

    def next(self) -> float:
        """The next delay in seconds: doubling up to the limit, with ±25% jitter."""
        delay = self._current
        self._current = min(self._current * 2, self.limit)
        return delay * random.uniform(0.75, 1.25)

    def reset(self) -> None:
        self._current = self.first
