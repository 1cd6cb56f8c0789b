"""The admin's actions (POST only; CSRF is checked by the middleware): on messages (requeue,
deliver now, reschedule, delete), on schedules (pause, resume, remove), on the queue's flow (pause,
resume, the rate limit), and purging dead letters."""

import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from redis.exceptions import RedisError

from delayqueue_django.admin.reschedule_form import RescheduleForm
from delayqueue_django.admin.view_base import ACTIONS, PAGE_SIZE, ViewsBase
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import loggable
from delayqueue_django.exceptions import InvalidSchedule, UnknownSchedule

logger = logging.getLogger("delayqueue_django.admin")

MAX_TIME_MS = 10**15  # (a time in ms past this, year 33658, is no time a page was read)


def buried_before_shown(request: HttpRequest) -> int | None:
    """The time (Redis's clock, ms) a confirmation page read its dead letters at, as its
    form posts it back: the action touches only those buried before. None, with a message
    to the user, when the form does not say it."""
    try:
        shown_at = int(request.POST.get("buried_before", ""))
    except ValueError:
        shown_at = -1
    if not 0 <= shown_at < MAX_TIME_MS:
        messages.error(
            request, "The form does not say which dead letters you saw. Reload the page."
        )
        return None
    return shown_at


# The schedule actions (Schedules' methods) and the permission each needs; remove applies
# only to a schedule whose definition cannot be read.
SCHEDULE_ACTIONS = {"pause": "change", "resume": "change", "remove": "delete"}
SCHEDULE_ACTIONS_DONE = {"pause": "paused", "resume": "resumed", "remove": "removed"}
# The queue's flow actions (all need the change permission), and what each did.
FLOW_ACTIONS = {"pause": "paused", "resume": "resumed", "rate": ""}


@dataclass(frozen=True)
class Done:
    """What an action did: the line the user reads, and the log entry's fields after who did
    it (each written as ``loggable`` makes it: an id or a name may come from a form)."""

    said: str
    logged: dict[str, str | int]
    # It stopped part-way (Redis could not be reached): said as an error, what it did
    # before logged all the same.
    stopped: bool = False


class Refused(Exception):
    """An action the admin does not take, in words for the user."""


class Actions(ViewsBase):
    """The actions, each checked against its permission."""

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
        if name == "reschedule":
            return self._reschedule(request, queue, ids, state, back)

        def perform() -> Done:
            done = self._perform(queue, name, ids, state)
            said = f"{label}: {done} of {len(ids)} message(s) in queue {queue_name!r}."
            if done < len(ids):
                said += f" The others were no longer {state}."
            return Done(said, {"ids": ",".join(ids), "done": done})

        return self._act(request, queue_name, name, back, perform)

    def _reschedule(
        self, request: HttpRequest, queue: Queue, ids: list[str], state: str, back: str
    ) -> HttpResponse:
        """Reschedule…: the POST from a list or a message's page asks for the new time (a
        page, nothing written); the form's own POST, marked ``confirmed``, gives the
        messages still waiting that due time, or shows the form again saying what is wrong,
        having written nothing."""
        form = RescheduleForm(request.POST if request.POST.get("confirmed") else None)
        if not form.is_valid():
            context = self._context(
                request,
                f"Reschedule messages of {queue.name}",
                queue=queue,
                form=form,
                ids=ids,
                state=state,
                back=back,
                action_url=self._url("action", queue.name),
            )
            return TemplateResponse(request, "admin/delayqueue_django/reschedule.html", context)

        def perform() -> Done:
            delay, at = form.cleaned_data["delay"], form.cleaned_data["at"]
            done = sum(queue.reschedule(message_id, delay=delay, at=at) for message_id in ids)
            said = (
                f"Reschedule: {done} of {len(ids)} message(s) in queue {queue.name!r}, "
                f"{form.described()}."
            )
            if done < len(ids):
                said += " The others were no longer waiting (in flight, dead or gone)."
            due = {"delay": f"{delay:g}"} if delay is not None else {"at": at.isoformat()}
            return Done(said, {"ids": ",".join(ids), "done": done, **due})

        return self._act(request, queue.name, "reschedule", back, perform)

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

        def perform() -> Done:
            if action == "remove" and queue.schedules.get(name).unreadable is None:
                raise Refused(
                    f"Schedule {name!r} of queue {queue_name!r} can be read: the admin removes "
                    "only schedules whose definition cannot be read."
                )
            getattr(queue.schedules, action)(name)
            said = f"Schedule {name!r} of queue {queue_name!r} {SCHEDULE_ACTIONS_DONE[action]}."
            return Done(said, {"schedule": name})

        return self._act(
            request,
            queue_name,
            f"schedule-{action}",
            back,
            perform,
            refusals=(UnknownSchedule, InvalidSchedule),
        )

    def flow_action(self, request: HttpRequest, queue_name: str) -> HttpResponse:
        """Pause or resume the queue, or set its rate limit ("" back to the setting's);
        POST, change permission (see docs/guides/flow-control.md)."""
        self._require(request, "view")
        queue = self._queue(queue_name)
        back = self._url("detail", queue_name)
        action = request.POST.get("action", "")
        if action not in FLOW_ACTIONS:
            messages.error(request, "Choose to pause or resume the queue, or set its rate.")
            return HttpResponseRedirect(back)
        self._require(request, "change")
        rate = request.POST.get("rate", "").strip()

        def perform() -> Done:
            if action == "rate":
                queue.set_rate_limit(rate or None)
                done = f"rate limit set to {rate}" if rate else "rate limit back to the setting's"
            else:
                getattr(queue, action)()
                done = FLOW_ACTIONS[action]
            return Done(f"Queue {queue_name!r}: {done}.", {"rate": rate})

        return self._act(
            request, queue_name, f"flow-{action}", back, perform, refusals=(ValueError,)
        )

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
        shown_at = buried_before_shown(request)
        if shown_at is None:
            return HttpResponseRedirect(self._url("purge", queue.name))

        def perform() -> Done:
            purged = queue.purge_garbage(buried_before_ms=shown_at)
            said = f"Purged {purged} dead letter(s) from queue {queue.name!r}."
            return Done(said, {"purged": purged})

        back = self._url("detail", queue.name) + "?state=garbage"
        return self._act(request, queue.name, "purge", back, perform)

    def _act(
        self,
        request: HttpRequest,
        queue_name: str,
        action: str,
        back: str,
        perform: Callable[[], Done],
        refusals: tuple[type[Exception], ...] = (),
    ) -> HttpResponseRedirect:
        """Perform an action and go back to ``back``, telling the user what came of it: what
        it did (and a log entry of who did it), or why it did nothing: a refusal (``Refused``
        or one of the store's ``refusals``, in its own words) or a Redis it cannot reach."""
        refused: tuple[type[Exception], ...] = (Refused, *refusals)
        try:
            done = perform()
        except refused as error:
            messages.error(request, str(error))
        except RedisError as error:
            messages.error(request, f"Redis is unavailable for queue {queue_name!r}: {error}")
        else:
            fields = " ".join(f"{key}={loggable(str(value))}" for key, value in done.logged.items())
            user = loggable(request.user.get_username())
            logger.info("admin action=%s queue=%s user=%s %s", action, queue_name, user, fields)
            (messages.error if done.stopped else messages.success)(request, done.said)
        return HttpResponseRedirect(back)


def _safe_next(request: HttpRequest, default: str) -> str:
    """Where to go back to after an action: a path on this site only."""
    from django.utils.http import url_has_allowed_host_and_scheme

    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return default
