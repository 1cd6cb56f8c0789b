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


@require_POST
def create_order(request: HttpRequest) -> HttpResponse:
    item = (request.POST.get("item") or "").strip()[:100] or "a teapot"
    window = timedelta(seconds=settings.SHOP_PAY_WINDOW)
    with transaction.atomic():
        order = Order.objects.create(item=item, pay_by=timezone.now() + window)
        # Sent only once the order is committed: a rolled-back order never gets timers.
        transaction.on_commit(lambda: schedule_timers(order.pk, window))
    messages.success(
        request, f"Order #{order.pk} created: pay within {settings.SHOP_PAY_WINDOW} s."
    )
    return redirect("home")


def schedule_timers(order_id: int, window: timedelta) -> None:
    expiry = delayqueue.send({"order": order_id, "kind": "expire"}, delay=window, queue="orders")
    Order.objects.filter(pk=order_id).update(expiry_message_id=expiry)
    delayqueue.send(
        {"order": order_id, "kind": "remind"}, delay=settings.SHOP_REMINDER_AFTER, queue="orders"
    )
    delayqueue.send({"order": order_id}, delay=1, queue="warehouse")
    reminder = settings.SHOP_REMINDER_AFTER
    Event.objects.create(
        queue="orders",
        kind="sent",
        message_id=expiry,
        text=f"order #{order_id}: expiry in {window.seconds} s, reminder in {reminder} s",
    )


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
    cancelled = delayqueue.cancel(order.expiry_message_id, queue="orders")
    text = (
        "expiry message cancelled"
        if cancelled
        else "expiry message already running; it will see the payment"
    )
    Event.objects.create(
        queue="orders",
        kind="cancel",
        message_id=order.expiry_message_id,
        text=f"order #{order.pk} paid: {text}",
    )
    messages.success(request, f"Order #{order.pk} paid in time.")
    return redirect("home")
