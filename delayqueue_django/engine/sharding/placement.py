"""Where each message of a sharded queue lives: its id names its shard.

A queue with ``SHARDS: N`` spreads its messages over N shards, each a whole queue to the
scripts under a hash tag of its own (engine.keys), so that on Redis Cluster they spread
over the masters. Shard 0 is the queue's own tag: an unsharded queue is shard 0 of
layout 1, and every layout shares it. Shard k (1 <= k < N) of layout N has the tag
``{prefix:queue~N.k.c}``, where ``c`` is the first counter that puts the tag's slot near
the middle of the k-th of N equal segments of the slot ring after the segment holding
shard 0's. The segments start where ``redis-cli --cluster create`` starts the ranges it
gives M masters (rounded to the nearest slot), so the N shards fall N/M to each master
whenever M divides N. Ids carry their shard: ``<id>~N.k`` (none for shard 0), so anyone
finds a message in one round trip, whatever layout its sender used.

A message sent with a key goes to its key's shard (key_shard: the CRC-32 of the key's UTF-8
bytes modulo N, the same in every process), so one shard, asked once, decides whether the
key's message waits; other messages go to a shard chosen at random.
"""

import functools
import random
import re
import zlib
from collections.abc import Sequence

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from delayqueue_django.engine.keys import QueueKeys

# The mark between an id and the shard it names; ids themselves are URL-safe base64, and
# tick ids ("tick:<schedule>:<ms>", always on shard 0) cannot end in "~<digits>.<digits>".
SHARD_MARK = "~"
MAX_SHARDS = 128
# Published on shard 0's wake-up channel when a layout is new on the register: a due time
# nothing else publishes (before 1970; the memory store's moved clock publishes 0), which
# has listeners read the register again. To a listener that does not know it, it is a
# wake-up due long ago: a harmless look.
LAYOUTS_CHANGED = -1

_SUFFIX = re.compile(r"~([1-9][0-9]{0,2})\.([1-9][0-9]{0,2})\Z")


def shard_of(message_id: str) -> tuple[int, int]:
    """``(layout, index)`` of the shard an id names; ``(1, 0)``, shard 0, for an id that
    names none (every unsharded queue's ids, schedule ticks)."""
    found = _SUFFIX.search(message_id)
    if found is None:
        return 1, 0
    layout, index = int(found[1]), int(found[2])
    if layout > MAX_SHARDS or index >= layout:
        return 1, 0
    return layout, index


def shard_name(layout: int, index: int) -> str:
    """How a shard is named in listings, metrics and ids: "0" for shard 0 (every layout's),
    else "<layout>.<index>"."""
    return "0" if index == 0 else f"{layout}.{index}"


def shard_suffix(layout: int, index: int) -> str:
    """What an id sent to this shard ends with ("" for shard 0)."""
    return "" if index == 0 else f"{SHARD_MARK}{layout}.{index}"


def place(
    message_ids: list[str], layout: int, keys: Sequence[str | None] | None = None
) -> list[str]:
    """Each new id with a shard of ``layout``, chosen at random: even spread, and no
    coordination between senders (nor any Redis asked). ``keys``, one per id (None for a
    message without one): an id with a key gets its key's shard instead."""
    if keys is None:
        return [
            message_id + shard_suffix(layout, random.randrange(layout))
            for message_id in message_ids
        ]
    return [
        message_id
        + shard_suffix(layout, random.randrange(layout) if key is None else key_shard(key, layout))
        for message_id, key in zip(message_ids, keys, strict=True)
    ]


def key_shard(key: str, layout: int) -> int:
    """The index of the shard of ``layout`` that messages sent with ``key`` go to: a
    stable hash of the key (CRC-32 of its UTF-8 bytes; Python's hash() differs from one
    process to the next), modulo the layout."""
    return zlib.crc32(key.encode("utf-8", "surrogateescape")) % layout


def with_shard(message_id: str, layout: int, index: int) -> str:
    """``message_id`` naming shard ``index`` of ``layout`` instead of the one it names."""
    found = _SUFFIX.search(message_id)
    if found is not None and shard_of(message_id) != (1, 0):
        message_id = message_id[: found.start()]
    return message_id + shard_suffix(layout, index)


def layout_names(layout: int) -> list[str]:
    """The names of layout N's shards, shard 0 first."""
    return [shard_name(layout, index) for index in range(layout)]


def parse_name(name: str) -> tuple[int, int]:
    """``(layout, index)`` of a shard's name (see shard_name); ValueError if it is none."""
    if name == "0":
        return 1, 0
    layout, _, index = name.partition(".")
    if not (layout.isascii() and layout.isdigit() and index.isascii() and index.isdigit()):
        raise ValueError(f"{name!r} is not a shard's name (0, or <layout>.<index>)")
    parsed = int(layout), int(index)
    if not 1 <= parsed[1] < parsed[0] <= MAX_SHARDS:
        raise ValueError(f"{name!r} is not a shard's name (0, or <layout>.<index>)")
    return parsed


def shard_keys(keys: QueueKeys, layout: int, index: int) -> QueueKeys:
    """The keys of shard ``index`` of ``layout`` of the queue whose shard 0 has ``keys``."""
    if index == 0:
        return keys
    return QueueKeys(keys.prefix, keys.queue, _spread_shard(keys.prefix, keys.queue, layout, index))


def slot_of(keys: QueueKeys) -> int:
    """The Redis Cluster slot of a shard's keys."""
    return int(key_slot(keys.tag.encode()))


@functools.lru_cache(maxsize=4096)
def _spread_shard(prefix: str, queue: str, layout: int, index: int) -> str:
    """ "<layout>.<index>.<c>" with the first counter c that puts the shard's slot within a
    small window around the middle of its segment: fixed forever by these inputs (a
    shard's keys must not move), a few hundred CRC16 sums on average, once per process.

    A window in the middle of a segment, not a point a k/N-th of the ring from shard 0's
    slot: shard 0's slot lies anywhere, and near a master's edge the others, each a few
    slots past their point, fell on either side of it (one queue name in about 40 put 5
    of 12 shards on one of 3 masters, 3 on another)."""
    ring = REDIS_CLUSTER_HASH_SLOTS
    first = int(key_slot(QueueKeys(prefix, queue).tag.encode()))
    home = max(segment for segment in range(layout) if _segment_start(segment, layout) <= first)
    segment = (home + index) % layout
    window = max(1, min(64, ring // (4 * layout)))
    low = (_segment_start(segment, layout) + _segment_start(segment + 1, layout) - window) // 2
    counter = 0
    while True:
        shard = f"{layout}.{index}.{counter}"
        slot = int(key_slot(QueueKeys(prefix, queue, shard).tag.encode()))
        if 0 <= slot - low < window:
            return shard
        counter += 1


def _segment_start(segment: int, layout: int) -> int:
    """The first slot of segment ``segment`` of the ring cut in ``layout``: ``segment *
    16384 / layout`` rounded to the nearest slot (never a tie for layout <= 128), as
    redis-cli rounds the ends of the masters' ranges; ``_segment_start(layout, layout)`` is
    the ring's end."""
    return (2 * segment * REDIS_CLUSTER_HASH_SLOTS + layout) // (2 * layout)
