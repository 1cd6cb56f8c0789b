"""The flow gates' values as the engine carries them (issue #27): a queue's state as the
``flow`` script reads it, and the share of a whole queue's rate limit or cap that each
shard of a sharded queue enforces.

A sharded queue's gates hold for the whole queue by giving each shard a fixed share: shard
``index`` of a layout of ``shards`` enforces ``total // shards``, plus one for the first
``total % shards`` shards, so the shares add up to the total exactly. This costs no round
trip at all (each shard's fetch decides alone, as on one shard), at the price that a shard
with no work leaves its share unused; messages are spread evenly over the shards, so the
shares are used evenly under load. (A reserve call on shard 0 before each fetch would share
one budget instead, at one more round trip per fetch, and for the cap one more per ack.)
"""

from dataclasses import dataclass

from delayqueue_django.engine.keys import QueueKeys


@dataclass(frozen=True, slots=True)
class FlowState:
    """A queue's flow state as kept in Redis."""

    paused: bool
    # A rate limit set at run time, overriding the setting: (limit, period_ms), or None.
    rate: tuple[int, int] | None


def rate_wire(rate: tuple[int, int] | None) -> str:
    """A rate as fetch.lua and flow.lua take it: "<limit>:<period ms>", "" for none."""
    return "" if rate is None else f"{rate[0]}:{rate[1]}"


def parse_rate_wire(text: str) -> tuple[int, int] | None:
    limit, _, period = text.partition(":")
    if not (limit.isdigit() and period.isdigit()):
        return None
    return int(limit), int(period)


def shard_share(total: int, shards: int, index: int) -> int:
    """Shard ``index``'s share of ``total`` over ``shards`` shards (see above)."""
    return total // shards + (1 if index < total % shards else 0)


def shard_position(keys: QueueKeys, layout: int) -> tuple[int, int]:
    """``(shards, index)`` of a shard's keys: shard 0 belongs to every layout, and takes its
    share of the queue's own ``layout``."""
    if not keys.shard:
        return layout, 0
    shards, index, _ = keys.shard.split(".")
    return int(shards), int(index)


def rate_share(
    rate: tuple[int, int] | None, keys: QueueKeys, layout: int
) -> tuple[int, int] | None:
    """The part of a queue's rate limit that one shard enforces."""
    if rate is None:
        return None
    shards, index = shard_position(keys, layout)
    return shard_share(rate[0], shards, index), rate[1]


def cap_share(cap: int, keys: QueueKeys, layout: int) -> int:
    """The part of a queue's MAX_IN_FLIGHT (0: none) that one shard enforces."""
    if cap == 0:
        return 0
    shards, index = shard_position(keys, layout)
    return shard_share(cap, shards, index)
