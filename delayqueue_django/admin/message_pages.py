"""The admin's page of one message (its record, its attempts and a preview of its payload)
and the download of its whole payload."""

from datetime import timedelta

from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.http import content_disposition_header
from redis.exceptions import RedisError

from delayqueue_django.admin.attempts import attempt_rows
from delayqueue_django.admin.dead_letters import why_it_died
from delayqueue_django.admin.display import (
    MESSAGE_PAYLOAD_BYTES,
    as_datetime,
    binary_size,
    download_name,
    pretty_payload,
)
from delayqueue_django.admin.view_base import ACTIONS, ViewsBase
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine import STATES, StoredMessage, printable
from delayqueue_django.engine.outcomes import ACKED, CANCELLED, EXPIRED_END, PURGED, REPLACED


class MessagePages(ViewsBase):
    """A message's page and its payload."""

    def message(self, request: HttpRequest, queue_name: str, message_id: str) -> TemplateResponse:
        self._require(request, "view")
        queue = self._queue(queue_name)
        try:
            # (On a queue with HISTORY_RETENTION, a message that ended reads as its outcome
            # record while that lasts: it has no attempt records left.)
            stored = queue.message(message_id, preview_bytes=MESSAGE_PAYLOAD_BYTES)
            stored_now = stored is not None and stored.state in STATES
            history = queue.history(message_id) if stored_now else []
        except RedisError as error:
            return self._unavailable(request, "message.html", f"Message {message_id}", queue, error)
        if stored is None:
            raise Http404(f"Queue {queue_name!r} has no message {message_id!r}.")
        if stored.state not in STATES:
            return self._ended(request, queue, stored)
        # Tracebacks only for those who may change the queue (#35): they can show a
        # handler's source lines and values that its error's text does not.
        with_traceback = self._can(request, "change")
        attempts = attempt_rows(history, with_traceback=with_traceback)
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
            dead_reason=why_it_died(stored) if stored.state == "garbage" else "",
            payload=stored.payload if cut else pretty_payload(stored.payload),
            cut=cut,
            shown_kib=MESSAGE_PAYLOAD_BYTES // 1024,
            whole_size=binary_size(stored.payload_size),
            download_url=self._url("payload", queue_name, message_id),
            attempts=attempts,
            tracebacks_hidden=not with_traceback and any(row.has_traceback for row in attempts),
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

    def _ended(self, request: HttpRequest, queue: Queue, stored: StoredMessage) -> TemplateResponse:
        """The page of a message that ended, from its outcome record: how and when it
        ended, its attempts, the worker that acked it and its key (nothing to act on)."""
        context = self._context(
            request,
            f"Message {stored.id}",
            queue=queue,
            stored=stored,
            how=HOW_IT_ENDED.get(stored.state, ""),
            # (A key read from the record as stored: bytes not UTF-8 shown as escapes.)
            key=None if stored.key is None else printable(stored.key),
            retention=timedelta(milliseconds=queue.config.history_retention_ms or 0),
            queue_url=self._url("detail", queue.name),
        )
        return TemplateResponse(request, "admin/delayqueue_django/ended.html", context)


# What each end means, for the page of a message that ended (see engine.outcomes).
HOW_IT_ENDED = {
    ACKED: "handled: its handler returned, and the worker acked it",
    CANCELLED: "cancelled while waiting (by id or key), or deleted while waiting or in flight",
    REPLACED: "replaced: a newer message of its key was waiting when it came back to wait",
    EXPIRED_END: "expired: dead-lettered as its expiry passed (then), and that dead letter deleted",
    PURGED: "purged: a dead letter, deleted (a purge, the garbage retention, a delete)",
}
