"""The bulk actions on the dead letters of one error class: "requeue" (change permission) or
"delete" (delete permission) every dead letter whose last error is of the class chosen in
the dead letters' filter. A GET shows how many there are and asks (nothing written); the
form's POST (CSRF checked by the middleware) acts on those buried before that page was read,
in batches (see admin.error_classes), and says what it did."""

from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from redis.exceptions import RedisError

from delayqueue_django.admin.actions import Actions, Done, buried_before_shown
from delayqueue_django.admin.error_classes import DeadLetter, choice_label, scan
from delayqueue_django.core.queue import Queue

# A bulk action reads at most this many dead letters a request (in batches of BATCH): on
# more, it stops there, says so, and the action is taken again for the rest.
ACTION_LIMIT = 100_000
# The bulk actions: the permission each needs, its label, and what it did.
BULK_ACTIONS = {
    "requeue": ("change", "Requeue (fresh retry budget)", "requeued"),
    "delete": ("delete", "Delete", "deleted"),
}


class ErrorClassActions(Actions):
    """The confirmation page and the action."""

    def by_error(self, request: HttpRequest, queue_name: str) -> HttpResponse:
        self._require(request, "view")
        queue = self._queue(queue_name)
        data = request.POST if request.method == "POST" else request.GET
        action, choice = data.get("action", ""), data.get("error", "")
        back = self._dead_letters_url(queue_name, choice)
        if action not in BULK_ACTIONS or not choice:
            messages.error(request, "Choose an error class, and to requeue or delete.")
            return HttpResponseRedirect(back)
        self._require(request, BULK_ACTIONS[action][0])
        if request.method == "POST":
            return self._by_error_confirmed(request, queue, action, choice, back)
        count, complete, buried_before, error_text = 0, True, None, ""
        try:
            stats = queue.stats()
            if stats["shards_down"]:
                # The action goes through every shard: it would stop at the first one down.
                error_text = f"{stats['shards_down']} of its shards cannot be reached"
            else:
                buried_before = stats["server_time_ms"]
                found = scan(queue, limit=ACTION_LIMIT, buried_before_ms=buried_before)
                count, complete = found.counts[choice], found.complete
        except RedisError as error:
            error_text = str(error)
        context = self._context(
            request,
            f"{BULK_ACTIONS[action][1]}: dead letters of {queue_name} by error",
            queue=queue,
            action=action,
            action_label=BULK_ACTIONS[action][1],
            choice=choice,
            label=choice_label(choice),
            count=count,
            complete=complete,
            limit=ACTION_LIMIT,
            buried_before=buried_before,
            redis_error=error_text,
            back=back,
        )
        return TemplateResponse(request, "admin/delayqueue_django/by_error.html", context)

    def _by_error_confirmed(
        self, request: HttpRequest, queue: Queue, action: str, choice: str, back: str
    ) -> HttpResponse:
        shown_at = buried_before_shown(request)
        if shown_at is None:
            return HttpResponseRedirect(back)
        label, did = BULK_ACTIONS[action][1:]

        def perform() -> Done:
            chosen = done = 0

            def each(batch: list[DeadLetter]) -> int:
                nonlocal chosen, done
                ids = [
                    letter.stored.id
                    for letter in batch
                    if letter.choice == choice and letter.stored.id
                ]
                chosen += len(ids)
                acted = _act_on(queue, action, ids)
                done += acted
                return acted

            stopped = ""
            try:
                found = scan(queue, limit=ACTION_LIMIT, buried_before_ms=shown_at, each=each)
            except RedisError as error:
                stopped = f" Then Redis could not be reached, and it stopped: {error}"
            said = (
                f"{label}: {done} dead letter(s) of queue {queue.name!r} whose last error is "
                f"{choice_label(choice)} {did}."
            )
            if done < chosen:
                said += f" {chosen - done} others were no longer dead letters."
            if not stopped and not found.complete:
                said += (
                    f" It stopped after reading {ACTION_LIMIT} dead letters: take the action "
                    "again for the rest."
                )
            logged: dict[str, str | int] = {"error": choice, "done": done}
            if stopped:
                return Done(said + stopped, {**logged, "stopped": "redis"}, stopped=True)
            return Done(said, logged)

        return self._act(request, queue.name, f"{action}-by-error", back, perform)

    def _dead_letters_url(self, queue_name: str, choice: str) -> str:
        query = {"state": "garbage", **({"error": choice} if choice else {})}
        return f"{self._url('detail', queue_name)}?{urlencode(query)}"


def _act_on(queue: Queue, action: str, ids: list[str]) -> int:
    """Requeue or delete these dead letters; how many were still dead letters."""
    if not ids:
        return 0
    if action == "requeue":
        return len(queue.requeue(ids))
    return sum(queue.delete(message_id, state="garbage") is not None for message_id in ids)
