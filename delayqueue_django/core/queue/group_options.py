"""Checking a send's ordered group (see "Ordered groups" in engine/lua/_prelude.lua) before
anything is written or deferred."""

from typing import Any

from delayqueue_django.exceptions import ConflictingOptions, InvalidGroup

# The longest group, in bytes of UTF-8: a group is stored with every grouped message.
GROUP_MAX_BYTES = 256


def check_group(group: Any) -> str | None:
    """The group (None: none), or InvalidGroup saying why it cannot be one: a str of 1 to
    GROUP_MAX_BYTES bytes in UTF-8 (any characters, but lone surrogates)."""
    if group is None:
        return None
    if not isinstance(group, str):
        raise InvalidGroup(f"group must be a str, not {type(group).__name__}")
    if not group:
        raise InvalidGroup("group must not be empty")
    try:
        size = len(group.encode("utf-8"))
    except UnicodeEncodeError as error:
        surrogate = error.object[error.start : error.end]
        raise InvalidGroup(
            f"group holds a lone surrogate ({surrogate!r}), which UTF-8 cannot carry"
        ) from None
    if size > GROUP_MAX_BYTES:
        raise InvalidGroup(f"group is {size} bytes in UTF-8; a group is at most {GROUP_MAX_BYTES}")
    return group


def check_key_and_group(queue: str, shards: int) -> None:
    """A message with both a key and a group, on a queue of ``shards`` shards: refused
    (ConflictingOptions) on more than one. A group lives on its group's shard, so that one
    shard orders it; a key is found on its key's shard (lookup, cancel and reschedule by
    key, and the send that keeps or replaces its message go there), which is another one
    for most pairs of key and group."""
    if shards > 1:
        raise ConflictingOptions(
            f"queue {queue!r} has SHARDS={shards}: a message there has a key or a group, not "
            "both. A group's messages live on its group's shard and a key's on its key's, "
            "which differ; keep keyed grouped messages on a queue of one shard"
        )
