"""Signal receivers writing the event log shown on the home page.

The worker's signals fire for every queue; these only log the shop's own.
"""

from typing import Any

from django.dispatch import receiver

from delayqueue_django.signals import message_acked, message_exhausted, message_nacked
from shop.models import Event

SHOP_QUEUES = frozenset({"orders", "warehouse"})


@receiver(message_acked)
def log_acked(*, queue: str, message: Any, **kwargs: Any) -> None:
    if queue in SHOP_QUEUES:
        Event.objects.create(
            queue=queue,
            kind="acked",
            message_id=message.id,
            text=f"attempt {message.attempt} succeeded",
        )


@receiver(message_nacked)
def log_nacked(*, queue: str, message: Any, error: Any, retry_at_ms: Any, **kwargs: Any) -> None:
    if queue in SHOP_QUEUES:
        then = "will be retried" if retry_at_ms is not None else "no retries left"
        Event.objects.create(
            queue=queue,
            kind="failed",
            message_id=message.id,
            text=f"attempt {message.attempt} failed ({error}); {then}",
        )


@receiver(message_exhausted)
def log_exhausted(*, queue: str, message: Any, **kwargs: Any) -> None:
    if queue in SHOP_QUEUES:
        Event.objects.create(
            queue=queue,
            kind="exhausted",
            message_id=message.id,
            text=f"gave up after {message.attempt} attempts; see the garbage list in the admin",
        )
