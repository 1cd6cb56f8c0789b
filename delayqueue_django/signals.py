"""Signals sent by the worker. Every one is sent with keyword arguments ``queue`` (the queue's
name) and ``message``; a receiver that raises is logged and never breaks the worker.

- ``message_acked``: after the ack is committed in Redis. ``message`` is the
  ``delayqueue_django.Message`` that was handled (its ``key`` and ``group`` too).
- ``message_nacked``: after a refusal is committed; also ``error`` (the exception the handler
  raised, or None when it returned False), ``retry_at_ms`` (when the retry is due, on the
  Redis clock, or None when the message was buried or superseded) and ``superseded`` (True
  when a keyed message was not retried because a newer message with its key waits: it is
  gone, and that newer one carries the key's work), ``postponed`` (True when the handler
  raised ``Postpone``: no attempt used) and ``dead_reason`` ("expired" or "postponed too
  often" when this refusal dead-lettered it for that reason, else "").
- ``message_exhausted``: at least once for every message whose retries are used up, even if
  a worker died in between (another worker announces it). ``message`` has ``id``, ``queue``,
  ``payload``, ``attempt``, ``key``, ``group`` and ``reason`` ("" when its retries ran out or it was
  rejected, "postponed too often" when a handler postponed it more than MAX_POSTPONES
  times).
- ``message_expired``: at least once for every message dead-lettered because its expiry
  passed before it was handed out (or before its retry was due), with the same guarantee
  as ``message_exhausted`` and the same ``message`` (its ``reason`` is "expired"); never
  both for one dead letter.
"""

from django.dispatch import Signal

message_acked = Signal()
message_nacked = Signal()
message_exhausted = Signal()
message_expired = Signal()
