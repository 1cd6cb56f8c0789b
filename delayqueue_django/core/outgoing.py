"""A message to send in bulk, each with its own timing and key."""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message for ``Queue.send_many`` with its own delay, due time, retry count or key.

    ``key``, ``if_exists`` and ``unique_for`` mean what they mean for ``send`` (see
    ``Queue.send``); they are given per item, as each item has its own key. Items of one
    call are decided in order, each seeing the earlier ones: a second item with the key of
    a first one keeps it, replaces it or is refused against it. ``group`` means what it
    means for ``send``: items of one group are handed out one at a time, in order.
    """

    payload: Any
    delay: float | timedelta | None = None
    at: datetime | None = None
    retry_count: int | None = None
    key: str | None = None
    if_exists: str = "keep"
    unique_for: float | timedelta | None = None
    # Its ordered group (see ``Queue.send``): the items of one group go one at a time.
    group: str | None = None
    # When the message expires if not handed out yet (see Queue.send).
    expires: float | timedelta | datetime | None = None


# What ``send`` takes for its one message and ``send_many`` takes per message, on Outgoing:
# one key (or group) for a whole call would keep or replace all of its messages but one.
PER_MESSAGE = ("key", "if_exists", "unique_for", "group")


def refuse_call_options(call: str, given: Mapping[str, Any]) -> None:
    """TypeError for keyword arguments a bulk send does not take (``given``, those its
    signature did not name): one that goes on each message says so, any other is refused
    in Python's own words."""
    for option in given:
        if option in PER_MESSAGE:
            raise TypeError(
                f"{call}() takes {option} per message, not for the call: give each message "
                f"as Outgoing(payload, {option}=...) (from delayqueue_django import Outgoing)"
            )
    for option in given:
        raise TypeError(f"{call}() got an unexpected keyword argument {option!r}")
