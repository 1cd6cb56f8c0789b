"""The wake-ups of a ``ShardedStore``: every shard's in one subscription."""

import time

from delayqueue_django.engine.sharding.fetch import ShardFetching
from delayqueue_django.engine.sharding.placement import LAYOUTS_CHANGED


class ShardedWakeups:
    """Every shard's wake-ups in one subscription, each told to the plan on its way. When
    the shards fetched from change (a layout to drain, or one retired), it subscribes
    again to the new list, and has the consumer look at every shard at once: what was
    published in between went unheard."""

    def __init__(self, store: ShardFetching) -> None:
        self._store = store
        self._generation, self._inner, self._names = store._subscribe()
        self._listening = True
        store.listening(+1)
        # What was published before this subscription took effect went unheard (a lost
        # subscription's replacement: the plan learnt since may say a shard is empty that
        # no longer is, and a later send there publishes nothing behind an older head).
        store._look_again(self._names.values())

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self._generation != self._store.generation:
                    return self._follow()
                heard = self._inner.wait_on(max(deadline - time.monotonic(), 0.0))
            except BaseException:
                # Wake-ups go unheard until the next subscription: the plan is not to be
                # trusted.
                self._stop_listening()
                raise
            if heard is None:
                return None
            channel, due_ms = heard
            name = self._names.get(channel)
            if name == "0" and due_ms == LAYOUTS_CHANGED:
                # A layout new on the register: read it now (the loop follows it if it
                # changes the shards fetched from; else there is nothing to tell).
                self._store.refresh_layouts(due=True)
                continue
            if name is not None:
                self._store.heard(name, due_ms)
            return due_ms

    def _follow(self) -> int:
        """Subscribe anew to the shards now fetched from; a wake-up due at once."""
        self._inner.close()
        self._generation, self._inner, self._names = self._store._subscribe()
        self._store._look_again(self._names.values())
        return 0

    def close(self) -> None:
        self._stop_listening()
        self._inner.close()

    def _stop_listening(self) -> None:
        if self._listening:
            self._listening = False
            self._store.listening(-1)
