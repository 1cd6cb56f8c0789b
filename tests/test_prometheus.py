"""Prometheus metrics: what the collector reads from Redis, totals that add up across
worker processes, and who may read the endpoint."""

import os
import signal
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from delayqueue_django.core.timings import HISTOGRAMS, Timings, histogram_from_totals
from delayqueue_django.engine.sharding.store import parts
from delayqueue_django.worker import heartbeat
from tests.backends import SHARDED_BACKENDS
from tests.helpers import send_what_reaches_redis, wait_for
from tests.redis_servers import RedisServer
from tests.test_worker_processes import WorkerProcess, events, spawn, workers  # noqa: F401

TOKEN = "a-long-random-scrape-token-0123456789"

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _token(settings: Any) -> None:
    settings.DELAYQUEUE_METRICS_TOKEN = TOKEN


def scrape(
    client: Client | None = None, **headers: str
) -> dict[tuple[str, tuple[Any, ...]], float]:
    """The samples served, by (name, sorted labels)."""
    client = client or Client()
    response = client.get("/metrics/", headers=headers or {"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def of(samples: dict[tuple[str, tuple[Any, ...]], float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted({"queue": "default", **labels}.items())))]


def test_state_counts_are_read_from_redis_at_scrape_time(configure: Callable[..., Queue]) -> None:
    queue = configure()
    queue.send_many(["a", "b"], delay=60)
    queue.send("due now")
    samples = scrape()
    assert of(samples, "delayqueue_up") == 1
    assert of(samples, "delayqueue_messages", state="pending") == 3
    assert of(samples, "delayqueue_due_messages") == 1
    assert of(samples, "delayqueue_messages", state="garbage") == 0
    assert of(samples, "delayqueue_workers") == 0
    assert of(samples, "delayqueue_handled_total") == 0
    assert of(samples, "delayqueue_messages", state="pending", queue="other") == 0

    queue.send("one more", delay=60)
    assert of(scrape(), "delayqueue_messages", state="pending") == 4


def test_superseded_keyed_messages_are_counted(configure: Callable[..., Queue]) -> None:
    queue = configure()
    assert of(scrape(), "delayqueue_superseded_total") == 0  # none counted yet
    queue.send({"order": 42}, key="order-42")
    [delivery] = queue.fetch(1).messages
    # While the first is in flight, a newer message with its key waits: the first is not
    # retried, but removed and counted.
    newer_id = queue.send({"order": 42, "newer": True}, key="order-42", delay=60)
    [outcome] = queue.nack([delivery], delay=0)
    assert outcome.superseded
    samples = scrape()
    assert of(samples, "delayqueue_superseded_total") == 1
    assert of(samples, "delayqueue_messages", state="pending") == 1
    found = queue.lookup("order-42")
    assert found is not None
    assert found.id == newer_id


def test_worker_totals_and_histograms_add_up_across_processes(
    workers: list[WorkerProcess],  # noqa: F811
    redis_server: RedisServer,
    settings: Any,
) -> None:
    # The retry budget travels with each message: set when it is sent.
    settings.DELAYQUEUES = {"default": {"URL": redis_server.url, "RETRY_COUNT": 0}}
    queue = get_queue()
    env = {"DQ_TEST_RETRY_COUNT": "0"}
    started = [spawn(workers, redis_server.url, "--batch-size", "5", **env) for _ in range(2)]
    wait_for(lambda: len(heartbeat.live_workers(queue)) == 2, timeout=30, what="two workers")
    # Handlers take a little while, so that both processes get a share.
    work = [{"do": "sleep", "seconds": 0.005}] * 200 + [{"do": "raise"}] * 40
    queue.send_many(work)
    wait_for(lambda: queue.stats()["acked_total"] == 200, timeout=60, what="200 handled")
    wait_for(lambda: queue.stats()["garbage"] == 40, timeout=60, what="40 dead letters")
    for worker in started:
        worker.signal(signal.SIGTERM)  # stopping adds the last timings
    assert [worker.wait(timeout=30) for worker in started] == [0, 0]
    # Both processes took part, so the figures below are sums over two processes.
    assert len({event["pid"] for event in events("start")}) == 2

    samples = scrape()
    assert of(samples, "delayqueue_handled_total") == 200
    assert of(samples, "delayqueue_failed_total") == 40
    assert of(samples, "delayqueue_exhausted_total") == 40
    assert of(samples, "delayqueue_retried_total") == 0
    assert of(samples, "delayqueue_messages", state="garbage") == 40
    for histogram in (
        "delayqueue_handler_duration_seconds",
        "delayqueue_delivery_lateness_seconds",
    ):
        assert of(samples, f"{histogram}_count") == 240
        assert of(samples, f"{histogram}_bucket", le="+Inf") == 240
        assert of(samples, f"{histogram}_sum") > 0
    # The messages were all due when the workers started: each waited a little, none long.
    assert of(samples, "delayqueue_delivery_lateness_seconds_bucket", le="60.0") == 240


def test_a_queue_whose_redis_is_down_reports_up_zero(
    configure: Callable[..., Queue], settings: Any
) -> None:
    configure()
    settings.DELAYQUEUES = {**settings.DELAYQUEUES, "other": {"URL": "redis://127.0.0.1:1/0"}}
    samples = scrape()
    assert of(samples, "delayqueue_up") == 1
    assert of(samples, "delayqueue_up", queue="other") == 0
    assert ("delayqueue_messages", (("queue", "other"), ("state", "pending"))) not in samples


def login(permission: bool, staff: bool = True, codename: str = "view_queue") -> Client:
    user = User.objects.create_user(f"watcher{User.objects.count()}", is_staff=staff)
    if permission:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def test_the_endpoint_needs_the_token_or_a_staff_user_allowed_to_view_queues() -> None:
    assert Client().get("/metrics/").status_code == 401
    assert Client().get("/metrics/").headers["WWW-Authenticate"].startswith("Bearer")
    assert Client().get("/metrics/", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert Client().get("/metrics/", headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
    # Staff with the view permission, no token (scrape() would send it).
    assert login(permission=True).get("/metrics/").status_code == 200
    # The change permission lets one view, as in the admin.
    assert login(permission=True, codename="change_queue").get("/metrics/").status_code == 200
    assert login(permission=True, codename="delete_queue").get("/metrics/").status_code == 403
    assert login(permission=False).get("/metrics/").status_code == 403
    assert login(permission=True, staff=False).get("/metrics/").status_code == 403
    assert (
        Client().post("/metrics/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 405
    )


def test_without_a_token_setting_only_staff_get_in(
    configure: Callable[..., Queue], settings: Any
) -> None:
    configure()
    del settings.DELAYQUEUE_METRICS_TOKEN
    assert Client().get("/metrics/", headers={"Authorization": "Bearer "}).status_code == 401
    assert Client().get("/metrics/", headers={"Authorization": "Bearer None"}).status_code == 401
    assert scrape(login(permission=True))


def test_timings_fall_into_their_buckets_and_survive_a_failed_flush() -> None:
    timings = Timings()
    for seconds in (0.0005, 0.001, 0.003, 7200):
        timings.observe("delivery_lateness", seconds)
    drained = timings.drain()
    assert timings.drain() == {}
    timings.restore(drained)  # Redis was away: try again later
    totals = timings.drain()
    histogram = histogram_from_totals(totals, "delivery_lateness")
    bounds = HISTOGRAMS["delivery_lateness"]
    cumulative = dict(histogram.buckets)
    assert cumulative[bounds[0]] == 2  # 0.001 is "at or below" the first bound
    assert cumulative[0.005] == 3
    assert cumulative[300.0] == 3
    assert cumulative[float("inf")] == histogram.count == 4
    assert histogram.sum_seconds == pytest.approx(7200.0045)


@pytest.mark.parametrize("backend_url", SHARDED_BACKENDS, indirect=True)
def test_a_sharded_queue_has_each_shards_counts_beside_its_unchanged_totals(
    configure: Callable[..., Queue],
) -> None:
    queue = configure()
    for n in range(20):
        queue.send({"n": n}, delay=60)
    queue.send("due now")
    stores = parts(queue.store)
    samples = scrape()
    assert of(samples, "delayqueue_up") == 1
    assert of(samples, "delayqueue_messages", state="pending") == 21
    assert of(samples, "delayqueue_due_messages") == 1
    for name, store in stores.items():
        stats = store.stats()
        assert of(samples, "delayqueue_shard_up", shard=name) == 1
        for state in ("pending", "ready", "unack", "retry", "garbage"):
            assert of(samples, "delayqueue_shard_messages", shard=name, state=state) == stats[state]
        assert of(samples, "delayqueue_shard_lag_seconds", shard=name) >= 0
    assert (
        sum(
            of(samples, "delayqueue_shard_messages", shard=name, state="pending") for name in stores
        )
        == 21
    )
    # The unsharded queue beside it has no shard metrics.
    assert not [
        key
        for key in samples
        if key[0].startswith("delayqueue_shard") and ("queue", "other") in key[1]
    ]


def test_without_a_sharded_queue_there_are_no_shard_metrics() -> None:
    get_queue().send("x")
    assert not [name for name, _ in scrape() if name.startswith("delayqueue_shard")]
    response = Client().get("/metrics/", headers={"Authorization": f"Bearer {TOKEN}"})
    assert "delayqueue_shard" not in response.content.decode()


@pytest.mark.cluster
def test_a_shard_that_cannot_be_reached_is_down_the_queue_gauges_those_of_the_others(
    shards_down: list[str],
) -> None:
    queue = get_queue()
    sent = send_what_reaches_redis(queue, 12)
    samples = scrape()
    assert of(samples, "delayqueue_up") == 0  # (not all of it answered)
    assert of(samples, "delayqueue_shards_down") == 2
    assert of(samples, "delayqueue_messages", state="pending") == sent
    assert of(samples, "delayqueue_workers") == 0
    # Counters summed short of two shards would fall, as if reset: left out.
    assert not [key for key in samples if key[0].startswith("delayqueue_handled")]
    assert not [key for key in samples if key[0].startswith("delayqueue_handler_duration")]
    for name in parts(queue.store):
        up = of(samples, "delayqueue_shard_up", shard=name)
        assert up == (0 if name in shards_down else 1)
        counted = (
            "delayqueue_shard_messages",
            (("queue", "default"), ("shard", name), ("state", "pending")),
        )
        assert (counted in samples) is not (name in shards_down)


def test_a_supervisor_and_its_worker_processes_are_told_apart(
    workers: list[WorkerProcess],  # noqa: F811
    redis_server: RedisServer,
    settings: Any,
) -> None:
    settings.DELAYQUEUES = {"default": {"URL": redis_server.url}}
    queue = get_queue()
    command = spawn(workers, redis_server.url, "--processes", "2", "--heartbeat", "0.2")
    wait_for(lambda: len(heartbeat.live_workers(queue)) == 3, timeout=30, what="3 heartbeats")
    samples = scrape()
    assert of(samples, "delayqueue_workers") == 2  # the supervisor handles nothing itself
    assert of(samples, "delayqueue_worker_restarts") == 0
    [child, _] = [w["pid"] for w in heartbeat.live_workers(queue) if w.get("supervisor")]
    os.kill(child, signal.SIGKILL)
    wait_for(lambda: of(scrape(), "delayqueue_worker_restarts") == 1, timeout=20)
    out = StringIO()
    wait_for(lambda: len(heartbeat.live_workers(queue)) == 3, timeout=30, what="the replacement")
    call_command("delayqueue_stats", stdout=out)
    assert f":{command.pid} supervising 2 processes, 1 restart" in out.getvalue()
    assert out.getvalue().count(f", under {command.pid})") == 2
    command.signal(signal.SIGTERM)
    assert command.wait(timeout=20) == 0
