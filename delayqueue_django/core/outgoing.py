"""A message to send in bulk, each with its own timing and key."""

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
