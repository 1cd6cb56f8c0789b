"""The admin's queue pages: an overview, one page per queue, a message page, the actions
and a JSON view of the counts. Every page costs a fixed number of Redis round trips, however
many messages a queue holds: counts in one script, lists by range with a limit."""

import logging
import math
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import content_disposition_header
from redis.exceptions import RedisError

from delayqueue_django.admin.display import (
    COUNT_NAMES,
    MESSAGE_PAYLOAD_BYTES,
    as_datetime,
    binary_size,
    call_arguments,
    download_name,
    from_epoch,
    pretty_payload,
    shard_table,
)
from delayqueue_django.core import registry
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import STATES, StoredMessage, loggable, printable
from delayqueue_django.exceptions import InvalidSchedule, UnknownQueue, UnknownSchedule
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
from delayqueue_django.schedules.api import ScheduleInfo
from delayqueue_django.worker import heartbeat

logger = logging.getLogger("delayqueue_django.admin")

PAGE_SIZE = 50
PREVIEW_BYTES = 300
MAX_TIME_MS = 10**15  # (a time in ms past this, year 33658, is no time a page was read)
THROUGHPUT_MINUTES = 15

# Which actions apply to which state, and the permission each needs.
ACTIONS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "requeue": ("Requeue (fresh retry budget)", "change", ("garbage",)),
    "deliver_now": ("Deliver now", "change", ("pending",)),
    "delete": ("Delete", "delete", STATES),
}
# The schedule actions (Schedules' methods) and the permission each needs; remove applies
# only to a schedule whose definition cannot be read.
SCHEDULE_ACTIONS = {"pause": "change", "resume": "change", "remove": "delete"}
SCHEDULE_ACTIONS_DONE = {"pause": "paused", "resume": "resumed", "remove": "removed"}


class QueueViews:
    """The views, bound to the ModelAdmin that registers them."""

    def __init__(self, model_admin: "admin.ModelAdmin[Any]") -> None:
        self.model_admin = model_admin
        self.admin_site = model_admin.admin_site
        self.opts = model_admin.model._meta

    # Permissions

    def _can(self, request: HttpRequest, permission: str) -> bool:
        """As elsewhere in the admin, which lists the queues for these users: the change
        permission lets one view too."""
        checks = {
            "view": self.model_admin.has_view_permission,
            "change": self.model_admin.has_change_permission,
            "delete": self.model_admin.has_delete_permission,
        }
        return checks[permission](request)

    def _require(self, request: HttpRequest, permission: str) -> None:
        if not self._can(request, permission):
            raise PermissionDenied

    def _unavailable(
        self,
        request: HttpRequest,
        template: str,
        title: str,
        queue: Queue,
        error: RedisError,
        **extra: Any,
    ) -> TemplateResponse:
        """The page, saying Redis cannot be reached (503), instead of a server error."""
        context = self._context(request, title, queue=queue, redis_error=str(error), **extra)
        return TemplateResponse(request, f"admin/delayqueue_django/{template}", context, status=503)

    def _queue(self, name: str) -> Queue:
        try:
            return registry.get_queue(name)
        except UnknownQueue:
            raise Http404(f"No queue named {name!r} in DELAYQUEUES.") from None

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "app_label": self.opts.app_label,
            "can_change": self._can(request, "change"),
            "can_delete": self._can(request, "delete"),
            **extra,
        }

    def _url(self, name: str, *args: str) -> str:
        return reverse(f"{self.admin_site.name}:delayqueue_django_queue_{name}", args=args)

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
        shards = shard_reports(queue)
        shard_context = shard_table(shards)
        try:
            stats = queue_totals(queue, shards)
            count = stats[state]
            pages = max(math.ceil(count / PAGE_SIZE), 1)
            page = _page_number(request.GET.get("page"), pages)
            # With shards down, the page shows what the others hold; a listing and the
            # throughput read every shard (they would only fail, after a timeout maybe),
            # and the workers and schedules are on shard 0.
            partial = unreachable(queue, shards or {}) if stats["shards_down"] else ""
            entries, throughput = [], []
            if not partial:
                entries = queue.list_messages(
                    state,
                    offset=(page - 1) * PAGE_SIZE,
                    limit=PAGE_SIZE,
                    preview_bytes=PREVIEW_BYTES,
                )
                throughput = queue.throughput(THROUGHPUT_MINUTES)
            workers: list[dict[str, Any]] | None = None
            schedules: list[ScheduleInfo] | None = None
            if not shard_down(shards, "0"):
                workers = heartbeat.live_workers(queue)
                schedules = queue.schedules.all()
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
            page=page,
            pages=pages,
            entries=[self._row(queue, entry) for entry in entries],
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
            # An id whose bytes are not UTF-8 (a foreign write) cannot travel in a URL or a
            # form: it is shown, without a link or a checkbox.
            "url": self._url("message", queue.name, entry.id) if shown_id == entry.id else None,
        }

    def message(self, request: HttpRequest, queue_name: str, message_id: str) -> TemplateResponse:
        self._require(request, "view")
        queue = self._queue(queue_name)
        try:
            stored = queue.peek(message_id, preview_bytes=MESSAGE_PAYLOAD_BYTES)
        except RedisError as error:
            return self._unavailable(request, "message.html", f"Message {message_id}", queue, error)
        if stored is None:
            raise Http404(f"Queue {queue_name!r} has no message {message_id!r}.")
        # peek cut it iff it is longer (payload_size counts the whole payload): a cut one is
        # shown as it came, as no JSON can be made of a part of it.
        cut = stored.payload is not None and stored.payload_size > MESSAGE_PAYLOAD_BYTES
        actions = [
            (key, label)
            for key, (label, permission, states) in ACTIONS.items()
            if stored.state in states and self._can(request, permission)
        ]
        context = self._context(
            request,
            f"Message {message_id}",
            queue=queue,
            stored=stored,
            when=as_datetime(stored.score_ms),
            payload=stored.payload if cut else pretty_payload(stored.payload),
            cut=cut,
            shown_kib=MESSAGE_PAYLOAD_BYTES // 1024,
            whole_size=binary_size(stored.payload_size),
            download_url=self._url("payload", queue_name, message_id),
            actions=actions,
            action_url=self._url("action", queue_name),
            queue_url=self._url("detail", queue_name) + f"?state={stored.state}",
        )
        return TemplateResponse(request, "admin/delayqueue_django/message.html", context)

    def payload(self, request: HttpRequest, queue_name: str, message_id: str) -> HttpResponse:
        """The whole payload as a file to download (GET, view permission): the bytes stored,
        not indented, without a trace context (bytes that are not UTF-8 too, which the page
        shows as escapes). It is read whole into this process once; nothing is changed."""
        self._require(request, "view")
        queue = self._queue(queue_name)
        try:
            payload = queue.peek_payload(message_id)
        except RedisError as error:
            return self._unavailable(request, "message.html", f"Message {message_id}", queue, error)
        if payload is None:
            raise Http404(f"Queue {queue_name!r} has no payload for message {message_id!r}.")
        response = HttpResponse(payload, content_type="application/json")
        response["Content-Disposition"] = content_disposition_header(
            True, download_name(queue_name, message_id)
        )
        return response

    # Actions (POST only; CSRF is checked by the middleware)

    def action(self, request: HttpRequest, queue_name: str) -> HttpResponse:
        self._require(request, "view")
        queue = self._queue(queue_name)
        name = request.POST.get("action", "")
        back = _safe_next(request, self._url("detail", queue_name))
        if name not in ACTIONS:
            messages.error(request, "Choose an action.")
            return HttpResponseRedirect(back)
        label, permission, states = ACTIONS[name]
        self._require(request, permission)
        # The state the user saw the messages in: an action leaves alone those that have
        # moved on since. Requeue and deliver now act on one state only, so theirs goes
        # without saying; a delete must say it.
        state = request.POST.get("state") or (states[0] if len(states) == 1 else "")
        if state not in states:
            messages.error(
                request, "The form does not say which messages you saw. Reload the page."
            )
            return HttpResponseRedirect(back)
        ids = [i for i in request.POST.getlist("ids") if i][: PAGE_SIZE * 2]
        if not ids:
            messages.warning(request, "No messages were selected.")
            return HttpResponseRedirect(back)
        try:
            done = self._perform(queue, name, ids, state)
        except RedisError as error:
            messages.error(request, f"Redis is unavailable for queue {queue_name!r}: {error}")
            return HttpResponseRedirect(back)
        logger.info(
            "admin action=%s queue=%s user=%s ids=%s done=%d",
            name,
            queue_name,
            loggable(request.user.get_username()),
            loggable(",".join(ids)),
            done,
        )
        text = f"{label}: {done} of {len(ids)} message(s) in queue {queue_name!r}."
        if done < len(ids):
            text += f" The others were no longer {state}."
        messages.success(request, text)
        return HttpResponseRedirect(back)

    def _perform(self, queue: Queue, name: str, ids: list[str], state: str) -> int:
        if name == "requeue":
            return len(queue.requeue(ids))
        if name == "deliver_now":
            return len(queue.deliver_now(ids))
        return sum(queue.delete(message_id, state=state) is not None for message_id in ids)

    def schedule_action(self, request: HttpRequest, queue_name: str) -> HttpResponse:
        """Pause or resume a schedule (POST, change permission), or remove one whose stored
        definition cannot be read (delete permission): nothing else can be done with it."""
        self._require(request, "view")
        queue = self._queue(queue_name)
        back = self._url("detail", queue_name)
        name, action = request.POST.get("name", ""), request.POST.get("action", "")
        if action not in SCHEDULE_ACTIONS or not name:
            messages.error(request, "Choose a schedule to pause, resume or remove.")
            return HttpResponseRedirect(back)
        self._require(request, SCHEDULE_ACTIONS[action])
        try:
            if action == "remove" and queue.schedules.get(name).unreadable is None:
                messages.error(
                    request,
                    f"Schedule {name!r} of queue {queue_name!r} can be read: the admin removes "
                    "only schedules whose definition cannot be read.",
                )
                return HttpResponseRedirect(back)
            getattr(queue.schedules, action)(name)
        except (UnknownSchedule, InvalidSchedule) as error:
            messages.error(request, str(error))
            return HttpResponseRedirect(back)
        except RedisError as error:
            messages.error(request, f"Redis is unavailable for queue {queue_name!r}: {error}")
            return HttpResponseRedirect(back)
        logger.info(
            "admin action=schedule-%s queue=%s user=%s schedule=%s",
            action,
            queue_name,
            loggable(request.user.get_username()),
            loggable(name),
        )
        messages.success(
            request, f"Schedule {name!r} of queue {queue_name!r} {SCHEDULE_ACTIONS_DONE[action]}."
        )
        return HttpResponseRedirect(back)

    def purge(self, request: HttpRequest, queue_name: str) -> HttpResponse:
        self._require(request, "delete")
        queue = self._queue(queue_name)
        if request.method == "POST":
            return self._purge_shown(request, queue)
        garbage: int | None = None
        buried_before: int | None = None
        error_text = ""
        try:
            stats = queue.stats()
        except RedisError as error:
            error_text = str(error)
        else:
            if stats["shards_down"]:
                # A purge goes through every shard: it would stop at the first one down.
                error_text = f"{stats['shards_down']} of its shards cannot be reached"
            else:
                garbage, buried_before = stats["garbage"], stats["server_time_ms"]
        context = self._context(
            request,
            f"Purge dead letters of {queue_name}",
            queue=queue,
            garbage=garbage,
            buried_before=buried_before,
            redis_error=error_text,
            queue_url=self._url("detail", queue_name) + "?state=garbage",
        )
        return TemplateResponse(request, "admin/delayqueue_django/purge.html", context)

    def _purge_shown(self, request: HttpRequest, queue: Queue) -> HttpResponse:
        """The purge confirmed: only the dead letters its page counted, those buried before
        it read the count (Redis's clock, ms); any buried since are left for another look."""
        try:
            shown_at = int(request.POST.get("buried_before", ""))
        except ValueError:
            shown_at = -1
        if not 0 <= shown_at < MAX_TIME_MS:
            messages.error(
                request, "The form does not say which dead letters you saw. Reload the page."
            )
            return HttpResponseRedirect(self._url("purge", queue.name))
        try:
            purged = queue.purge_garbage(buried_before_ms=shown_at)
        except RedisError as error:
            messages.error(request, f"Redis is unavailable for queue {queue.name!r}: {error}")
        else:
            logger.info(
                "admin action=purge queue=%s user=%s purged=%d",
                queue.name,
                loggable(request.user.get_username()),
                purged,
            )
            messages.success(request, f"Purged {purged} dead letter(s) from queue {queue.name!r}.")
        return HttpResponseRedirect(self._url("detail", queue.name) + "?state=garbage")

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


def _safe_next(request: HttpRequest, default: str) -> str:
    """Where to go back to after an action: a path on this site only."""
    from django.utils.http import url_has_allowed_host_and_scheme

    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return default
