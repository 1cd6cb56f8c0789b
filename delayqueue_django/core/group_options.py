"""Checking a send's ordered group (see "Ordered groups" in engine/lua/_prelude.lua) before
anything is written or deferred."""

from typing import Any

from delayqueue_django.exceptions import ConflictingOptions, InvalidGroup

# The longest group, in bytes of UTF-8: a group is stored with every grouped message.
GROUP_MAX_BYTES = 256


def check_group(group: Any, key: str | None) -> str | None:
    """The group (None: none), or InvalidGroup saying why it cannot be one: a str of 1 to
    GROUP_MAX_BYTES bytes in UTF-8 (any characters, but lone surrogates). A message with
    a key cannot have a group (ConflictingOptions): a replace would move a message of one
    group in the order of another, and a superseded one would leave its group's order."""
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
    if key is not None:
        raise ConflictingOptions(
            "a message has a key or a group, not both: a keyed message may be replaced or "
            "superseded, which an ordered group's sequence cannot follow"
        )
    return group
