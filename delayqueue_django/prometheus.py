"""Prometheus metrics for every configured queue (the optional ``prometheus`` extra).

    # urls.py
    from delayqueue_django.prometheus import metrics_view
    urlpatterns = [path("metrics/delayqueue", metrics_view), ...]

Everything is read from Redis (and the outbox rows from the database) at scrape time, so
the figures are those of all workers together, whichever process serves the scrape: state
counts, lag and live workers from the queue itself; handled, failed, retried, timed-out,
exhausted, expired, postponed and superseded totals counted by the queue's scripts; handler
duration and delivery lateness histograms added up by the workers (each worker adds its
observations with every heartbeat).

A queue spread over shards (its ``SHARDS`` option) also has each shard's state counts,
lag and reachability, labelled with the shard's name, and how many of its shards are down;
its other metrics are the queue's. While some of its shards are down, its gauges are those
of the others, and its counters and histograms are left out of the scrape (a sum short of
a shard would look like a counter reset, and its return like a burst).

The view answers a request carrying ``Authorization: Bearer <DELAYQUEUE_METRICS_TOKEN>``,
or from a logged-in staff user allowed to view queues in the admin (the view or the change
permission, as there).
"""

import hmac
from collections.abc import Iterable, Iterator
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from redis.exceptions import RedisError

from delayqueue_django.core import registry
from delayqueue_django.core.timings import HISTOGRAMS, histogram_from_totals
from delayqueue_django.monitoring.reports import (
    outbox_report,
    queue_totals,
    shard_down,
    shard_reports,
    worker_processes,
)
from delayqueue_django.worker import heartbeat

try:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.registry import Collector
except ImportError:
    raise ImproperlyConfigured(
        "delayqueue_django.prometheus needs prometheus-client: "
        "pip install 'delayqueue-django[prometheus]'"
    ) from None

TOKEN_SETTING = "DELAYQUEUE_METRICS_TOKEN"
# Either lets one view the queues, as in the admin.
PERMISSIONS = ("delayqueue_django.view_queue", "delayqueue_django.change_queue")

STATES = ("pending", "ready", "unack", "retry", "garbage")
# stats() total -> (metric name without _total, help)
TOTALS = {
    "acked_total": ("delayqueue_handled", "Deliveries handled successfully (acked)."),
    "failed_total": ("delayqueue_failed", "Deliveries that failed: refused or timed out."),
    "retried_total": ("delayqueue_retried", "Failed deliveries scheduled for another attempt."),
    "timed_out_total": (
        "delayqueue_timed_out",
        "Deliveries not acked within MAX_CONSUME_DURATION.",
    ),
    "exhausted_total": (
        "delayqueue_exhausted",
        "Messages parked as dead letters with their retries used up.",
    ),
    "expired_total": (
        "delayqueue_expired",
        "Messages dead-lettered because their expiry passed before they were handed out.",
    ),
    "postponed_total": (
        "delayqueue_postponed",
        "Deliveries a handler postponed (raise Postpone): back later, no attempt used.",
    ),
    "superseded_total": (
        "delayqueue_superseded",
        "Keyed messages removed on their way back to waiting: a newer message with their "
        "key waits and carries the key's work.",
    ),
}
HISTOGRAM_HELP = {
    "handler_duration": "How long handlers ran, in seconds.",
    "delivery_lateness": "How long after its due time a delivery's handler started, in seconds.",
    "event_loop_blocked": "How long an async handler blocked its worker's event loop, each time "
    "past DELAYQUEUE_LOOP_BLOCKED_AFTER, in seconds.",
}


class QueueCollector(Collector):
    """Collects the metrics of the given queues (default: every queue in DELAYQUEUES) at
    scrape time. Register it in your own registry to serve them from an existing endpoint."""

    def __init__(self, queue_names: Iterable[str] | None = None) -> None:
        self.queue_names = None if queue_names is None else list(queue_names)

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "delayqueue_up",
            "1 if the queue's Redis (every shard's) answered this scrape.",
            labels=["queue"],
        )
        messages = GaugeMetricFamily(
            "delayqueue_messages", "Messages in each state.", labels=["queue", "state"]
        )
        due = GaugeMetricFamily(
            "delayqueue_due_messages",
            "Pending messages whose time has come, not yet taken by a worker.",
            labels=["queue"],
        )
        lag = GaugeMetricFamily(
            "delayqueue_lag_seconds",
            "How long the oldest due message has waited for a worker.",
            labels=["queue"],
        )
        workers = GaugeMetricFamily(
            "delayqueue_workers",
            "Worker processes with a live heartbeat (supervisors not counted).",
            labels=["queue"],
        )
        restarts = GaugeMetricFamily(
            "delayqueue_worker_restarts",
            "Worker processes that died and were replaced, as live supervisors count them.",
            labels=["queue"],
        )
        totals = {
            key: CounterMetricFamily(name, help_text, labels=["queue"])
            for key, (name, help_text) in TOTALS.items()
        }
        histograms = {
            name: HistogramMetricFamily(
                f"delayqueue_{name}_seconds", HISTOGRAM_HELP[name], labels=["queue"]
            )
            for name in HISTOGRAMS
        }
        paused = GaugeMetricFamily(
            "delayqueue_paused",
            "1 while the queue is paused (Queue.pause): no worker hands out its messages.",
            labels=["queue"],
        )
        outbox = GaugeMetricFamily(
            "delayqueue_outbox_messages",
            "Messages sent through the outbox, committed, not yet relayed to Redis.",
            labels=["queue"],
        )
        outbox_age = GaugeMetricFamily(
            "delayqueue_outbox_oldest_seconds",
            "How long the oldest message waiting in the outbox has waited (0 when none).",
            labels=["queue"],
        )
        shard_up = GaugeMetricFamily(
            "delayqueue_shard_up",
            "1 if the Redis of this shard of a sharded queue answered this scrape.",
            labels=["queue", "shard"],
        )
        shard_messages = GaugeMetricFamily(
            "delayqueue_shard_messages",
            "Messages in each state on each shard of a sharded queue.",
            labels=["queue", "shard", "state"],
        )
        shards_down = GaugeMetricFamily(
            "delayqueue_shards_down",
            "Shards of a sharded queue whose Redis did not answer this scrape: the queue's "
            "gauges leave them out.",
            labels=["queue"],
        )
        shard_lag = GaugeMetricFamily(
            "delayqueue_shard_lag_seconds",
            "How long the oldest due message of each shard of a sharded queue has waited.",
            labels=["queue", "shard"],
        )
        sharded = False
        for name in self.queue_names or registry.queue_names():
            queue = registry.get_queue(name)
            waiting = outbox_report(queue)
            if waiting["outbox"] is not None:
                outbox.add_metric([name], waiting["outbox"])
                outbox_age.add_metric([name], waiting["outbox_age_ms"] / 1000)
            shards = shard_reports(queue)
            for shard_name, shard in (shards or {}).items():
                sharded = True
                shard_up.add_metric([name, shard_name], int(shard["ok"]))
                if shard["ok"]:
                    for state in STATES:
                        shard_messages.add_metric([name, shard_name, state], shard[state])
                    shard_lag.add_metric([name, shard_name], shard["lag_ms"] / 1000)
            if shards is not None:
                shards_down.add_metric([name], sum(not shard["ok"] for shard in shards.values()))
            try:
                stats = queue_totals(queue, shards)
                # Running totals are summed over every shard (and the heartbeats are on
                # shard 0): with shards down, not asked.
                running = None if stats["shards_down"] else queue.store.totals()
                live = None if shard_down(shards, "0") else heartbeat.live_workers(queue)
            except RedisError:
                up.add_metric([name], 0)
                continue
            # A shard that cannot be reached leaves the queue's gauges short: up 0.
            up.add_metric([name], int(not stats["shards_down"]))
            for state in STATES:
                messages.add_metric([name, state], stats[state])
            due.add_metric([name], stats["due"])
            lag.add_metric([name], stats["lag_ms"] / 1000)
            paused.add_metric([name], stats.get("paused", 0))
            if live is not None:
                workers.add_metric([name], len(worker_processes(live)))
                restarts.add_metric(
                    [name], sum(w.get("restarts", 0) for w in live if w.get("role") == "supervisor")
                )
            if running is None:
                continue
            for key, family in totals.items():
                family.add_metric([name], stats[key])
            for histogram, histogram_family in histograms.items():
                figures = histogram_from_totals(running, histogram)
                histogram_family.add_metric(
                    [name],
                    [(_bound(le), count) for le, count in figures.buckets],
                    sum_value=figures.sum_seconds,
                )
        yield from (up, messages, due, lag, paused, workers, restarts, *totals.values())
        yield from histograms.values()
        yield from (outbox, outbox_age)
        if sharded:  # (without a sharded queue, the output is as it was before SHARDS)
            yield from (shard_up, shards_down, shard_messages, shard_lag)


def _bound(le: float) -> str:
    return "+Inf" if le == float("inf") else repr(le)


def _allowed(request: HttpRequest) -> bool:
    token = getattr(settings, TOKEN_SETTING, None)
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if token and scheme.lower() == "bearer" and given:
        return hmac.compare_digest(given.encode(), str(token).encode())
    user: Any = request.user if hasattr(request, "user") else None
    return bool(
        user
        and user.is_active
        and user.is_staff
        and any(user.has_perm(permission) for permission in PERMISSIONS)
    )


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Every queue's metrics in Prometheus' text format, for a request carrying
    ``Authorization: Bearer <DELAYQUEUE_METRICS_TOKEN>`` or from a staff user allowed to
    view queues; 401 or 403 otherwise."""
    if not _allowed(request):
        user: Any = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            return HttpResponse("Not allowed.\n", status=403, content_type="text/plain")
        response = HttpResponse("Authentication required.\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="delayqueue metrics"'
        return response
    collectors = CollectorRegistry(auto_describe=False)
    collectors.register(QueueCollector())
    return HttpResponse(generate_latest(collectors), content_type=CONTENT_TYPE_LATEST)
