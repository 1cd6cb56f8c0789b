"""The admin's pages of queues: the overview, one page per queue (counts, throughput, shards,
workers, schedules, a page of messages in one state), and their JSON for monitoring."""

import math
from dataclasses import replace
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.template.response import TemplateResponse
from redis.exceptions import RedisError

from delayqueue_django.admin import charts
from delayqueue_django.admin.attempts import error_cell
from delayqueue_django.admin.display import (
    COUNT_NAMES,
    as_datetime,
    call_arguments,
    from_epoch,
    shard_table,
)
from delayqueue_django.admin.error_classes import (
    NO_ERROR,
    ErrorFilter,
    choice_label,
    error_filter,
)
from delayqueue_django.admin.message_search import SearchResult, search_messages
from delayqueue_django.admin.queue_status import queue_status
from delayqueue_django.admin.view_base import ACTIONS, PAGE_SIZE, ViewsBase
from delayqueue_django.core import registry
from delayqueue_django.core.queue import Queue
from delayqueue_django.core.queue_schedules import ScheduleInfo
from delayqueue_django.engine import STATES, StoredMessage, printable
from delayqueue_django.monitoring.reports import (
    describe_running,
    outbox_report,
    queue_report,
    queue_totals,
    running_handlers,
    shard_down,
    shard_reports,
    unreachable,
)
from delayqueue_django.worker import heartbeat

PREVIEW_BYTES = 300
THROUGHPUT_MINUTES = 15
# The dead letters' page reads at most this many of them for its filter by error class (in
# batches of error_classes.BATCH): the counts and a chosen class's list are of those.
FILTER_LIMIT = 10_000


class QueuePages(ViewsBase):
    """The overview, a queue's page, and the JSON views."""

    # Pages

    def overview(self, request: HttpRequest) -> TemplateResponse:
        self._require(request, "view")
        rows = []
        for name in registry.queue_names():
            row: dict[str, Any] = {"name": name, "url": self._url("detail", name)}
            queue = registry.get_queue(name)
            row.update(outbox_report(queue))
            shards = shard_reports(queue)
            row["shards"] = None if shards is None else len(shards)
            try:
                stats = queue_totals(queue, shards)
                row["counts"] = [stats[key] for key in COUNT_NAMES]
                row["lag_seconds"] = stats["lag_ms"] / 1000
                row["next_due"] = as_datetime(stats["next_due_ms"])
                row["shards_down"] = stats["shards_down"]
                if stats["shards_down"]:
                    row["partial"] = unreachable(queue, shards or {})
                # Not read while shard 0, which holds the flow state and the heartbeats, is
                # down: the row says so.
                if not shard_down(shards, "0"):
                    live = heartbeat.live_workers(queue)
                    row["status"] = queue_status(queue, queue.flow(), live)
            except RedisError as error:
                row["error"] = str(error)
            rows.append(row)
        context = self._context(
            request, "Delay queues", rows=rows, count_names=COUNT_NAMES, json_url=self._url("json")
        )
        return TemplateResponse(request, "admin/delayqueue_django/overview.html", context)

    def detail(self, request: HttpRequest, queue_name: str) -> TemplateResponse:
        self._require(request, "view")
        queue = self._queue(queue_name)
        state = request.GET.get("state", "pending")
        if state not in STATES:
            state = "pending"
        # The dead letters' filter: the class of their last error (see admin.error_classes).
        chosen = request.GET.get("error", "") if state == "garbage" else ""
        shards = shard_reports(queue)
        shard_context = shard_table(shards)
        # The search box (a GET: it only reads); an empty box searches nothing.
        find = request.GET.get("find", "")
        search: SearchResult | None = None
        if find:
            search = search_messages(
                queue, find, lambda message_id: self._url("message", queue_name, message_id)
            )
        try:
            stats = queue_totals(queue, shards)
            count = stats[state]
            pages = max(math.ceil(count / PAGE_SIZE), 1)
            page = _page_number(request.GET.get("page"), pages)
            # With shards down, the page shows what the others hold; a listing and the
            # throughput read every shard (they would only fail, after a timeout maybe),
            # and the workers and schedules are on shard 0.
            partial = unreachable(queue, shards or {}) if stats["shards_down"] else ""
            entries, throughput, history = [], [], None
            history_range = charts.range_of(request.GET.get("history"))
            errors: ErrorFilter | None = None
            if not partial and state == "garbage":
                errors = error_filter(queue, chosen, limit=FILTER_LIMIT)
            if errors is not None and chosen:
                # The page of those of the chosen class (the filter read them all, up to
                # its limit), their previews read again as the list reads them.
                pages = max(math.ceil(len(errors.matches) / PAGE_SIZE), 1)
                page = _page_number(request.GET.get("page"), pages)
                # (The store's peek: the filter read their last errors already.)
                shown = errors.matches[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
                entries = [
                    replace(stored, last_error=letter.last_error)
                    for letter in shown
                    if (stored := queue.store.peek(letter.stored.id, preview_bytes=PREVIEW_BYTES))
                    is not None
                ]
            elif not partial:
                # (A page of dead letters comes with their last errors.)
                entries = queue.list_messages(
                    state,
                    offset=(page - 1) * PAGE_SIZE,
                    limit=PAGE_SIZE,
                    preview_bytes=PREVIEW_BYTES,
                )
            if not partial:
                throughput = queue.throughput(THROUGHPUT_MINUTES)
                back, step, _ = charts.RANGES[history_range]
                history = charts.history_context(
                    queue.metrics(since=back, step=step), history_range
                )
            workers: list[dict[str, Any]] | None = None
            schedules: list[ScheduleInfo] | None = None
            flow = status = None
            if not shard_down(shards, "0"):
                workers = heartbeat.live_workers(queue)
                schedules = queue.schedules.all()
                flow = queue.flow()
                status = queue_status(queue, flow, workers)
        except RedisError as error:
            return self._unavailable(
                request, "queue.html", f"Queue {queue_name}", queue, error, **shard_context
            )
        actions = [
            (key, label)
            for key, (label, permission, states) in ACTIONS.items()
            if state in states and self._can(request, permission)
        ]
        peak = max([acked + failed for _, acked, failed in throughput] + [1])
        context = self._context(
            request,
            f"Queue {queue_name}",
            queue=queue,
            config=queue.config,
            max_consume_seconds=queue.config.max_consume_ms / 1000,
            stats=stats,
            counts=[(name, stats[name]) for name in COUNT_NAMES],
            state=state,
            states=STATES,
            find=find,
            search=search,
            page=page,
            pages=pages,
            entries=[self._row(queue, entry) for entry in entries],
            errors=errors,
            error_choice=chosen,
            error_label=choice_label(chosen),
            no_error=NO_ERROR,
            filter_limit=FILTER_LIMIT,
            by_error_url=self._url("by_error", queue_name),
            actions=actions,
            next_due=as_datetime(stats["next_due_ms"]),
            lag_seconds=stats["lag_ms"] / 1000,
            partial=partial,
            **shard_context,
            throughput=[
                {
                    "minute": as_datetime(start),
                    "acked": acked,
                    "failed": failed,
                    "acked_percent": round(100 * acked / peak),
                    "failed_percent": round(100 * failed / peak),
                }
                for start, acked, failed in throughput
            ],
            history=history,
            history_range=history_range,
            throughput_totals=(
                sum(row[1] for row in throughput),
                sum(row[2] for row in throughput),
            ),
            workers=None
            if workers is None
            else [
                {
                    **worker,
                    "started": from_epoch(worker.get("started")),
                    "last_seen": from_epoch(worker.get("last_seen")),
                    "running": [describe_running(h) for h in running_handlers(worker)],
                }
                for worker in workers
            ],
            json_url=self._url("queue_json", queue_name),
            action_url=self._url("action", queue_name),
            purge_url=self._url("purge", queue_name),
            schedules=None
            if schedules is None
            else [self._schedule_row(queue, info) for info in schedules],
            schedule_action_url=self._url("schedule_action", queue_name),
            flow=flow,
            status=status,
            flow_action_url=self._url("flow_action", queue_name),
        )
        return TemplateResponse(request, "admin/delayqueue_django/queue.html", context)

    def _schedule_row(self, queue: Queue, info: ScheduleInfo) -> dict[str, Any]:
        name = printable(info.name)
        # A name whose bytes are not UTF-8 (a foreign write) cannot travel in a URL or a
        # form: it is shown, without a link or a button.
        postable = name == info.name
        row = {
            "info": info,
            "name": name,
            "postable": postable,
            "next_url": None
            if info.next_id is None or not postable
            else self._url("message", queue.name, info.next_id),
        }
        schedule = info.schedule
        if schedule is None:  # its definition cannot be read: info.unreadable says why
            return {**row, "fires": "—", "carries": "—", "missed": "—"}
        if schedule.task is not None:
            carries = f"task {schedule.task}({call_arguments(schedule.args, schedule.kwargs)})"
        else:
            carries = schedule.payload[:200]
        return {
            **row,
            "fires": schedule.describe(),
            "carries": carries,
            "missed": f"{schedule.missed}, after {schedule.missed_after_ms / 1000:g} s"
            + (f", the latest {schedule.missed_limit}" if schedule.missed == "all" else ""),
        }

    def _row(self, queue: Queue, entry: StoredMessage) -> dict[str, Any]:
        payload = entry.payload or ""
        preview = payload[:200]
        shown_id = printable(entry.id)
        return {
            "entry": entry,
            "id": shown_id,
            "when": as_datetime(entry.score_ms),
            "preview": preview,
            "cut": entry.payload_size > len(preview.encode()),
            "last_error": error_cell(entry.last_error),
            # An id whose bytes are not UTF-8 (a foreign write) cannot travel in a URL or a
            # form: it is shown, without a link or a checkbox.
            "url": self._url("message", queue.name, entry.id) if shown_id == entry.id else None,
        }

    # JSON for monitoring

    def queue_json(self, request: HttpRequest, queue_name: str) -> JsonResponse:
        self._require(request, "view")
        return JsonResponse(_queue_summary(self._queue(queue_name)))

    def all_json(self, request: HttpRequest) -> JsonResponse:
        self._require(request, "view")
        return JsonResponse(
            {
                "queues": {
                    name: _queue_summary(registry.get_queue(name))
                    for name in registry.queue_names()
                }
            }
        )


def _queue_summary(queue: Queue) -> dict[str, Any]:
    """The monitoring report, with the number of live workers rather than their details."""
    report = queue_report(queue)
    if report.get("workers") is not None:
        report["workers"] = len(report["workers"])
    return report


def _page_number(raw: str | None, pages: int) -> int:
    try:
        page = int(raw or 1)
    except ValueError:
        return 1
    return min(max(page, 1), pages)
