"""Orders whose expiry timer is gone: the demo deletes its queues' keys from a Redis it did
not start when it stops, and a later run on that Redis (or on another one) would show their
orders "awaiting payment (in 0 s)" for ever, as no expiry is left to cancel them."""

from delayqueue_django import get_queue
from delayqueue_django.models import OutboxMessage
from shop.models import Event, Order


def cancel_orders_without_timers() -> int:
    """Cancel every order awaiting payment whose expiry (found by its key) neither the
    orders queue nor the outbox holds (a message in flight counts as held); return how
    many."""
    queue = get_queue("orders")
    in_outbox = set(
        OutboxMessage.objects.filter(queue="orders", message_key__isnull=False).values_list(
            "message_key", flat=True
        )
    )
    orphans = [
        order
        for order in Order.objects.filter(status=Order.Status.AWAITING_PAYMENT)
        if order.expiry_key not in in_outbox and queue.lookup(order.expiry_key) is None
    ]
    for order in orphans:
        cancelled = Order.objects.filter(pk=order.pk, status=Order.Status.AWAITING_PAYMENT).update(
            status=Order.Status.CANCELLED
        )
        if cancelled:
            Event.objects.create(
                queue="orders",
                kind="cancelled",
                text=f"order #{order.pk}: cancelled at start, its expiry timer was gone "
                "(an earlier run's keys were deleted from Redis)",
            )
    return len(orphans)
