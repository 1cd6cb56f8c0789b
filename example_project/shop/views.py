from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

import delayqueue_django as delayqueue
from shop.models import Event, Order


def home(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    orders = list(Order.objects.all()[:20])
    for order in orders:
        order.seconds_left = max(int((order.pay_by - now).total_seconds()), 0)  # type: ignore[attr-defined]
    context = {
        "orders": orders,
        "events": Event.objects.all()[:40],
        "pay_window": settings.SHOP_PAY_WINDOW,
        "reminder_after": settings.SHOP_REMINDER_AFTER,
    }
    template = "shop/live.html" if request.GET.get("live") else "shop/home.html"
    return render(request, template, context)


# --8<-- [start:create]
@require_POST
def create_order(request: HttpRequest) -> HttpResponse:
    item = (request.POST.get("item") or "").strip()[:100] or "a teapot"
    window = timedelta(seconds=settings.SHOP_PAY_WINDOW)
    with transaction.atomic():
        order = Order.objects.create(item=item, pay_by=timezone.now() + window)
        # Both queues have OUTBOX (settings.py): the timers are written in this transaction,
        # so they exist exactly when the order does, even if Redis is down right now.
        schedule_timers(order, window)
    messages.success(
        request, f"Order #{order.pk} created: pay within {settings.SHOP_PAY_WINDOW} s."
    )
    return redirect("home")


def schedule_timers(order: Order, window: timedelta) -> None:
    """The order's timers, sent through the outbox within the caller's transaction."""
    expiry = delayqueue.send(
        {"order": order.pk, "kind": "expire"}, key=order.expiry_key, delay=window, queue="orders"
    )
    delayqueue.send(
        {"order": order.pk, "kind": "remind"},
        key=order.reminder_key,
        delay=settings.SHOP_REMINDER_AFTER,
        queue="orders",
    )
    delayqueue.send({"order": order.pk}, delay=1, queue="warehouse")
    reminder = settings.SHOP_REMINDER_AFTER
    Event.objects.create(
        queue="orders",
        kind="sent",
        message_id=expiry,
        text=f"order #{order.pk}: expiry in {window.seconds} s, reminder in {reminder} s",
    )


# --8<-- [end:create]
# --8<-- [start:pay]
@require_POST
def pay_order(request: HttpRequest, order_id: int) -> HttpResponse:
    order = get_object_or_404(Order, pk=order_id)
    paid = Order.objects.filter(pk=order.pk, status=Order.Status.AWAITING_PAYMENT).update(
        status=Order.Status.PAID
    )
    if not paid:
        messages.error(
            request, f"Order #{order.pk} can no longer be paid: it is {order.get_status_display()}."
        )
        return redirect("home")
    cancelled = delayqueue.cancel(key=order.expiry_key, queue="orders")
    text = (
        "expiry message cancelled"
        if cancelled
        else "expiry message not waiting in the queue (running, or still in the outbox); "
        "the expiry will see the payment"
    )
    Event.objects.create(queue="orders", kind="cancel", text=f"order #{order.pk} paid: {text}")
    messages.success(request, f"Order #{order.pk} paid in time.")
    return redirect("home")


# --8<-- [end:pay]
