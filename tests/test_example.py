"""The example shop, driven as a user would: through its views, with the worker in burst mode
on Redis, and with the test helpers (``delayqueue_django.testing``) on memory queues, the way
a project tests its own queue code without a worker and without waiting."""

import logging
import re
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from shop.models import Event, Order

from delayqueue_django import get_queue
from delayqueue_django.testing import MemoryQueues, Verdict, memory_queues
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def shop_queues(settings: Any, redis_server: RedisServer) -> None:
    """As the example's settings: sent through the outbox, the orders handled exactly once."""
    settings.DELAYQUEUE_OUTBOX_DATABASES = ["default"]
    settings.DELAYQUEUES = {
        "orders": {
            "URL": redis_server.url,
            "HANDLER": "shop.handlers.on_order_message",
            "OUTBOX": True,
            "EXACTLY_ONCE": True,
        },
        "warehouse": {
            "URL": redis_server.url,
            "HANDLER": "shop.handlers.notify_warehouse",
            "RETRY_COUNT": 2,
            "NACK_REDELIVERY_DELAY": 0,
            "OUTBOX": True,
        },
    }


def create_order(client: Client, item: str) -> Order:
    response = client.post("/shop/orders/", {"item": item}, follow=True)
    assert response.status_code == 200
    return Order.objects.get(item=item)


def run_worker() -> None:
    call_command("run_delayqueue", burst=True, verbosity=0)


def test_an_unpaid_order_is_cancelled_a_paid_one_is_kept(settings: Any) -> None:
    client = Client()
    unpaid = create_order(client, "kettle")
    paid = create_order(client, "teapot")
    # Committed with the orders, in the outbox: no relay has run yet.
    assert get_queue("orders").outbox_stats()["outbox"] == 4  # an expiry and a reminder each
    run_worker()  # relays them, and runs the reminders (due at once here)
    assert get_queue("orders").stats()["pending"] == 2

    response = client.post(f"/shop/orders/{paid.pk}/pay/", follow=True)
    assert "paid in time" in response.content.decode()
    assert get_queue("orders").lookup(paid.expiry_key) is None  # its expiry was cancelled
    assert get_queue("orders").lookup(unpaid.expiry_key) is not None

    time.sleep(settings.SHOP_PAY_WINDOW + 0.2)
    run_worker()

    unpaid.refresh_from_db()
    paid.refresh_from_db()
    assert unpaid.status == Order.Status.CANCELLED
    assert paid.status == Order.Status.PAID
    texts = list(Event.objects.values_list("text", flat=True))
    assert f"order #{unpaid.pk} cancelled: not paid in time" in texts
    assert f"order #{unpaid.pk}: payment reminder e-mailed" in texts
    assert f"order #{paid.pk} paid: expiry message cancelled" in texts

    page = client.get("/shop/").content.decode()
    assert re.search(r'class="cancelled">cancelled \(not paid in time\)', page)
    assert client.post(f"/shop/orders/{unpaid.pk}/pay/", follow=True).status_code == 200
    unpaid.refresh_from_db()
    assert unpaid.status == Order.Status.CANCELLED  # too late to pay


def test_the_failing_warehouse_handler_ends_in_the_garbage_list(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = Client()
    order = create_order(client, "toaster")
    time.sleep(1.1)  # the warehouse notification is sent with a 1 s delay
    with caplog.at_level(logging.WARNING, logger="delayqueue_django.worker"):
        run_worker()
    # A failure on purpose, expected: one line each, where a traceback of 11 lines was.
    assert not [r for r in caplog.records if r.exc_info]
    retried = [r.getMessage() for r in caplog.records if "asked to retry" in r.getMessage()]
    assert len(retried) == 3
    assert retried[0].endswith(
        f"attempt=1: warehouse API unreachable for order #{order.pk} (failing on purpose)"
    )

    warehouse = get_queue("warehouse")
    [dead] = warehouse.list_messages("garbage")
    assert dead.payload == f'{{"order":{order.pk}}}'
    assert dead.attempt == 3
    kinds = list(Event.objects.filter(queue="warehouse").values_list("kind", flat=True))
    assert kinds.count("failed") == 3
    assert kinds.count("exhausted") == 1
    assert "gave up after 3 attempts" in client.get("/shop/").content.decode()


def test_an_order_rolled_back_sends_nothing(redis_server: RedisServer) -> None:
    from django.db import transaction
    from shop.views import schedule_timers

    with transaction.atomic():
        order = Order.objects.create(item="never", pay_by="2030-01-01T00:00:00Z")
        schedule_timers(order, timedelta(seconds=1))
        transaction.set_rollback(True)
    run_worker()
    assert get_queue("orders").outbox_stats()["outbox"] == 0
    assert redis_server.client().dbsize() == 0


def test_orders_whose_timers_are_gone_are_cancelled_and_no_other(
    redis_server: RedisServer,
) -> None:
    """make demo deletes its keys from a Redis it did not start when it stops: the next
    run cancels the orders whose expiry went with them (before, they stayed "awaiting
    payment (in 0 s)" for ever), and keeps those whose expiry waits in the outbox or in
    Redis."""
    from shop.orphans import cancel_orders_without_timers

    client = Client()
    create_order(client, "kettle")
    create_order(client, "teapot")
    run_worker()  # relays both orders' timers to Redis (none is due yet)
    create_order(client, "cup")  # its timers still in the outbox
    assert cancel_orders_without_timers() == 0
    # As the demo's exit does on a Redis it did not start: the queues' keys deleted.
    redis_server.client().flushall()

    assert cancel_orders_without_timers() == 2
    statuses = dict(Order.objects.values_list("item", "status"))
    assert statuses == {"kettle": "cancelled", "teapot": "cancelled", "cup": "awaiting"}
    said = Event.objects.filter(kind="cancelled").values_list("text", flat=True)
    assert [text.split(": ", 1)[1] for text in said] == [
        "cancelled at start, its expiry timer was gone (an earlier run's keys were deleted "
        "from Redis)"
    ] * 2
    assert cancel_orders_without_timers() == 0


def test_an_expiry_delivered_again_after_its_commit_changes_nothing_twice() -> None:
    """The worker died after the expiry's transaction committed, before its ack: the
    redelivery is acked without running the handler, so one event, not two."""
    from shop.handlers import on_order_message

    from delayqueue_django.worker.handling import call_handler

    order = create_order(Client(), "clock")
    run_worker()  # relays the timers; the reminder runs
    orders = get_queue("orders")
    waiting = orders.lookup(order.expiry_key)
    assert waiting is not None
    orders.deliver_now([waiting.id])
    [expiry] = [m for m in orders.fetch(10).messages if m.key == order.expiry_key]
    assert call_handler(on_order_message, expiry).verdict is Verdict.ACK  # committed, no ack
    assert call_handler(on_order_message, expiry).verdict is Verdict.ACK  # the redelivery
    order.refresh_from_db()
    assert order.status == Order.Status.CANCELLED
    texts = list(Event.objects.filter(message_id=expiry.id, kind="expire").values_list("text"))
    assert texts == [(f"order #{order.pk} cancelled: not paid in time",)]


@pytest.fixture
def delayqueues() -> Iterator[MemoryQueues]:
    with memory_queues() as queues:
        yield queues


def test_the_shop_with_the_test_helpers(delayqueues: MemoryQueues, settings: Any) -> None:
    client = Client()
    unpaid = create_order(client, "kettle")
    paid = create_order(client, "teapot")

    expiries = [m for m in delayqueues.sent("orders") if m.payload["kind"] == "expire"]
    assert [m.key for m in expiries] == [unpaid.expiry_key, paid.expiry_key]
    assert {m.delay for m in expiries} == {timedelta(seconds=settings.SHOP_PAY_WINDOW)}
    assert [m.payload for m in delayqueues.sent("warehouse")] == [
        {"order": unpaid.pk},
        {"order": paid.pk},
    ]

    client.post(f"/shop/orders/{paid.pk}/pay/")
    delayqueues.run_due()  # the reminders, sent with no delay
    delayqueues.advance(settings.SHOP_PAY_WINDOW)
    outcomes = delayqueues.run_due()

    unpaid.refresh_from_db()
    paid.refresh_from_db()
    assert (unpaid.status, paid.status) == (Order.Status.CANCELLED, Order.Status.PAID)
    warehouse = [o for o in outcomes if o.message.queue == "warehouse"]
    assert [o.verdict for o in warehouse] == [Verdict.NACK] * 6  # 3 attempts each
    kinds = list(Event.objects.filter(queue="warehouse").values_list("kind", flat=True))
    assert (kinds.count("failed"), kinds.count("exhausted")) == (6, 2)
    assert f"order #{unpaid.pk} cancelled: not paid in time" in Event.objects.values_list(
        "text", flat=True
    )
