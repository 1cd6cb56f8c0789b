"""Signals sent by the worker. Every one is sent with keyword arguments ``queue`` (the queue's
name) and ``message``; a receiver that raises is logged and never breaks the worker.

- ``message_acked``: after the ack is committed in Redis. ``message`` is the
  ``delayqueue_django.Message`` that was handled.
- ``message_nacked``: after a refusal is committed; also ``error`` (the exception the handler
  raised, or None when it returned False) and ``retry_at_ms`` (when the retry is due, on the
  Redis clock, or None when the message was buried).
- ``message_exhausted``: at least once for every message whose retries are used up, even if
  a worker died in between (another worker announces it). ``message`` has ``id``, ``queue``,
  ``payload`` and ``attempt``.
"""

from django.dispatch import Signal

message_acked = Signal()
message_nacked = Signal()
message_exhausted = Signal()
