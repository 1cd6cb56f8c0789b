"""The example's handlers, named in DELAYQUEUES (settings.py)."""

from typing import Any

from delayqueue_django import Message, Retry
from shop.models import Event, Order


def on_order_message(message: Message) -> None:
    """Order timers: an unpaid order's reminder, and its expiry.

    The orders queue is EXACTLY_ONCE (settings.py): this runs in a transaction that also
    records the message as processed, so the cancellation and its event are written once,
    even when a worker dies before its ack and the message is delivered again."""
    order_id, kind = message.payload["order"], message.payload["kind"]
    if kind == "expire":
        # One conditional UPDATE: paying and expiring can race, and only one may win.
        cancelled = Order.objects.filter(pk=order_id, status=Order.Status.AWAITING_PAYMENT).update(
            status=Order.Status.CANCELLED
        )
        text = f"order #{order_id} " + (
            "cancelled: not paid in time" if cancelled else "was paid: nothing to do"
        )
    else:
        unpaid = Order.objects.filter(pk=order_id, status=Order.Status.AWAITING_PAYMENT).exists()
        text = f"order #{order_id}: " + (
            "payment reminder e-mailed" if unpaid else "no reminder needed"
        )
    Event.objects.create(queue=message.queue, kind=kind, message_id=message.id, text=text)


def notify_warehouse(message: Message) -> Any:
    """Fails on purpose, so retries, exhaustion and the admin's garbage list can be seen.

    A failure the handler expects, so it raises Retry: the worker logs one line with the
    reason and retries after the queue's NACK_REDELIVERY_DELAY. (An exception it did not
    expect would be logged with its traceback.)"""
    raise Retry(
        reason=f"warehouse API unreachable for order #{message.payload['order']} "
        "(failing on purpose)"
    )
