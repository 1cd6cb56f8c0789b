"""Names of the Redis keys of one queue, or of one shard of a sharded queue.

Every key of a queue carries the same hash tag, ``{prefix:queue}``, so Redis Cluster keeps
them in one slot and each Lua script touches a single slot. A queue spread over shards
(the SHARDS option, see engine.sharding.placement) keeps that tag for its first shard and gives each
other shard a tag of its own, ``{prefix:queue~<layout>.<index>.<spread>}``: each shard is
a whole queue to the scripts, in a slot of its own.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class QueueKeys:
    prefix: str
    queue: str
    # Empty for a queue's first shard (every unsharded queue); else the rest of its tag,
    # "<layout>.<index>.<spread>" (see engine.sharding.placement.shard_keys).
    shard: str = ""

    @property
    def tag(self) -> str:
        if not self.shard:
            return "{" + f"{self.prefix}:{self.queue}" + "}"
        return "{" + f"{self.prefix}:{self.queue}~{self.shard}" + "}"

    def key(self, part: str) -> str:
        return f"{self.tag}:{part}"

    @property
    def layout(self) -> list[str]:
        """KEYS as every script receives them, in the order _prelude.lua documents."""
        parts = ("pending", "ready", "unack", "retry", "garbage")
        return [self.key(part) for part in parts] + [
            self.key("payload"),
            self.key("meta"),
            self.key("exhausted"),
            self.key("quarantine"),
            self.key("throughput"),
        ]

    @property
    def schedule_keys(self) -> list[str]:
        """The extra KEYS of the schedule scripts: definitions, where ticks stand, why a
        schedule's ticks could not be written, and when workers last declared a schedule in
        their settings."""
        parts = ("schedules", "schedule_ticks", "schedule_failures", "schedule_declared")
        return [self.key(part) for part in parts]

    @property
    def wakeup_channel(self) -> str:
        """Pub/sub channel on which scripts announce that work is due earlier than planned."""
        return self.key("wakeup")
