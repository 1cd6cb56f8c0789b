"""What a sharded queue asks of each shard's store beside the queue's calls: the register of
layouts (engine.sharding.layouts) and the keys it holds (a key's home, see
engine.sharding.store)."""

from collections.abc import Iterator
from typing import Any

from delayqueue_django.engine.flow import FlowState
from delayqueue_django.engine.keyed_calls import wire
from delayqueue_django.engine.sharding.placement import LAYOUTS_CHANGED
from delayqueue_django.engine.store.base import RedisStoreBase
from delayqueue_django.engine.store.replies import _flow_state


class RedisLayouts(RedisStoreBase):
    """The layouts register and the keys held, for a sharded queue."""

    def layouts(self) -> set[int]:
        return {int(layout) for layout in self.client.smembers(self.keys.key("layouts"))}

    def add_layout(self, layout: int) -> tuple[bool, FlowState]:
        # One function, not SADD then PUBLISH: a process dying between those two calls
        # registered the layout without telling the workers.
        added, paused, rate_text, _ = self._run(
            "add_layout",
            [self._channel, layout, LAYOUTS_CHANGED],
            extra_keys=[self.keys.key("layouts")],
        )
        return bool(added), _flow_state(paused, rate_text)

    def retire_layout(self, layout: int) -> bool:
        return bool(self.client.srem(self.keys.key("layouts"), layout))

    def holds_key(self, key: str) -> bool:
        held, _ = self._run("holds_key", [wire(key)])
        return bool(held)

    def keys_used(self) -> bool:
        return bool(self.client.exists(self.keys.key("keys")))

    def stored_keys(self) -> Iterator[str]:
        client: Any = self.client  # redis-py types hscan_iter loosely
        for key, _ in client.hscan_iter(self.keys.key("keys"), count=1000):
            if key:  # (not the field "" that marks a queue that has had keys)
                yield key.decode("utf-8", "surrogateescape") if isinstance(key, bytes) else key
