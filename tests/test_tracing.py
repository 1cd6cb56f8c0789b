"""OpenTelemetry tracing: producer spans on send, consumer spans around handler calls, linked
through the trace context a traced message carries (see docs/guides/tracing.md)."""

import asyncio
import subprocess
import sys
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import transaction
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    StatusCode,
    TraceFlags,
)
from opentelemetry.util.types import Attributes

from delayqueue_django import get_queue
from delayqueue_django.core import tracing
from delayqueue_django.core.message import Message
from delayqueue_django.core.queue import Queue
from delayqueue_django.exceptions import QueueUnavailable, Reject
from delayqueue_django.outbox.relay import OutboxRelay
from delayqueue_django.worker.handling import Verdict, call_handler
from tests.helpers import redis_store, wait_for
from tests.redis_servers import free_port


class _Switch(Sampler):
    """Samples only while a test of this module runs: the provider is process-wide, and the
    other tests' messages must stay untraced."""

    on = False

    def should_sample(
        self,
        parent_context: otel_context.Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        parent = trace.get_current_span(parent_context).get_span_context()
        if not self.on or (parent.is_valid and not parent.trace_flags.sampled):
            return SamplingResult(Decision.DROP)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self) -> str:
        return "on while a tracing test runs"


_SWITCH = _Switch()
_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider(sampler=_SWITCH)
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
        # A send of an earlier test may have found none within the second (see active).
        tracing.look_again()
    _EXPORTER.clear()
    _SWITCH.on = True
    yield _EXPORTER
    _SWITCH.on = False
    _EXPORTER.clear()


def _one(spans: InMemorySpanExporter, kind: SpanKind) -> ReadableSpan:
    found = [span for span in spans.get_finished_spans() if span.kind is kind]
    assert len(found) == 1, found
    return found[0]


def _traceparent(span: ReadableSpan) -> str:
    """The W3C traceparent header naming the span."""
    assert span.context is not None
    context = span.context
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def _stored(queue: Queue, message_id: str) -> bytes:
    """The message's stored payload, from past its budget and due time."""
    stored = redis_store(queue).client.hget(redis_store(queue).keys.key("payload"), message_id)
    assert isinstance(stored, bytes)
    return b"~" + stored.split(b"~", 3)[3]


def _fetch_one(queue: Queue) -> Message:
    messages = queue.fetch(10).messages
    assert len(messages) == 1
    return messages[0]


def test_send_and_handle_make_one_trace(queue: Queue, spans: InMemorySpanExporter) -> None:
    message_id = queue.send({"order": 7})

    sent = _one(spans, SpanKind.PRODUCER)
    assert sent.name == "send default"
    assert sent.attributes == {
        "messaging.system": "delayqueue_django",
        "messaging.destination.name": "default",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.message.id": message_id,
    }
    message = _fetch_one(queue)
    assert message.payload == {"order": 7}
    assert sent.context is not None
    assert message.traceparent == _traceparent(sent)

    outcome = call_handler(lambda message: None, message, manage_connections=False)

    assert outcome.verdict is Verdict.ACK
    handled = _one(spans, SpanKind.CONSUMER)
    assert handled.name == "process default"
    assert handled.context is not None
    assert handled.parent is not None
    assert handled.context.trace_id == sent.context.trace_id
    assert handled.parent.span_id == sent.context.span_id
    assert [link.context.span_id for link in handled.links] == [sent.context.span_id]
    assert handled.attributes == {
        "messaging.system": "delayqueue_django",
        "messaging.destination.name": "default",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": message_id,
        "messaging.message.delivery_attempt": 1,
        "delayqueue.verdict": "ack",
    }
    assert handled.status.status_code is StatusCode.UNSET


def test_a_batch_is_one_span_and_its_messages_carry_it(
    queue: Queue, spans: InMemorySpanExporter
) -> None:
    ids = queue.send_many([1, 2, 3])

    sent = _one(spans, SpanKind.PRODUCER)
    assert sent.attributes is not None
    assert sent.context is not None
    assert sent.attributes["messaging.batch.message_count"] == 3
    assert "messaging.message.id" not in sent.attributes
    messages = queue.fetch(10).messages
    assert sorted(message.id for message in messages) == sorted(ids)
    assert sorted(message.payload for message in messages) == [1, 2, 3]
    assert {message.traceparent.split("-")[2] for message in messages} == {
        f"{sent.context.span_id:016x}"
    }


def test_a_traced_keyed_send_keeps_its_key(queue: Queue, spans: InMemorySpanExporter) -> None:
    message_id = queue.send({"order": 7}, key="order-7")
    assert queue.send({"order": 8}, key="order-7") == message_id  # the key kept it
    sent = [span for span in spans.get_finished_spans() if span.kind is SpanKind.PRODUCER]
    assert sent[0].context is not None
    message = _fetch_one(queue)
    assert (message.id, message.key, message.payload) == (message_id, "order-7", {"order": 7})
    assert message.traceparent == _traceparent(sent[0])


def test_a_traced_send_keeps_its_group_and_expiry(
    redis_queue: Queue, spans: InMemorySpanExporter
) -> None:
    # (The stamped copy of a message had carried its key over, and dropped these.)
    grouped = redis_queue.send({"order": 9}, group="customer:9", expires=3600)
    sent = _one(spans, SpanKind.PRODUCER)
    store = redis_store(redis_queue)
    assert store.client.zscore(store.keys.key("expires"), grouped) is not None
    message = _fetch_one(redis_queue)
    assert (message.id, message.group) == (grouped, "customer:9")
    assert message.traceparent == _traceparent(sent)


def test_active_asks_the_api_at_most_once_a_second_while_no_provider_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    asked: list[object] = []
    answer: list[object] = [trace.ProxyTracerProvider()]

    def get_tracer_provider() -> object:
        asked.append(answer[0])
        return answer[0]

    monkeypatch.setattr(tracing, "_provider_set", False)
    monkeypatch.setattr(tracing, "_next_look", 0.0)
    monkeypatch.setattr(tracing, "time", SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(trace, "get_tracer_provider", get_tracer_provider)

    assert not any(tracing.active() for _ in range(1000))
    assert len(asked) == 1  # the "no" kept, not asked 1000 times
    # A provider set meanwhile is found once the second has passed, and kept for good.
    answer[0] = TracerProvider()
    now[0] += tracing.LOOK_AGAIN_SECONDS - 0.001
    assert not tracing.active()
    assert len(asked) == 1
    now[0] += 0.002
    assert tracing.active()
    assert len(asked) == 2
    now[0] += 3600
    assert all(tracing.active() for _ in range(1000))
    assert len(asked) == 2


def test_look_again_finds_a_provider_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    answer: list[object] = [trace.ProxyTracerProvider()]
    monkeypatch.setattr(tracing, "_provider_set", False)
    monkeypatch.setattr(tracing, "_next_look", 0.0)
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: answer[0])
    assert not tracing.active()
    answer[0] = TracerProvider()
    assert not tracing.active()  # within the second: the "no" kept
    tracing.look_again()
    assert tracing.active()


def test_asend_is_traced(queue: Queue, spans: InMemorySpanExporter) -> None:
    message_id = asyncio.run(queue.asend("hello"))

    sent = _one(spans, SpanKind.PRODUCER)
    assert sent.attributes is not None
    assert sent.attributes["messaging.message.id"] == message_id
    message = _fetch_one(queue)
    assert message.payload == "hello"
    assert message.traceparent == _traceparent(sent)


def test_the_trace_context_is_never_shown_as_payload(
    queue: Queue, spans: InMemorySpanExporter
) -> None:
    message_id = queue.send({"a": 1}, delay=60)

    stored = queue.peek(message_id)
    assert stored is not None
    assert stored.payload == '{"a":1}'
    assert [entry.payload for entry in queue.list_messages("pending")] == ['{"a":1}']


def test_a_failing_handler_marks_its_span(queue: Queue, spans: InMemorySpanExporter) -> None:
    ids = dict(
        zip(
            queue.send_many(["refused", "raised", "rejected"]),
            ["refused", "raised", "rejected"],
            strict=True,
        )
    )
    handlers = {
        "refused": lambda message: False,
        "raised": lambda message: 1 / 0,
        "rejected": _reject,
    }
    for message in queue.fetch(10).messages:
        call_handler(handlers[message.payload], message, manage_connections=False)

    handled = {
        ids[str(span.attributes["messaging.message.id"])]: span  # type: ignore[index]
        for span in spans.get_finished_spans()
        if span.kind is SpanKind.CONSUMER
    }
    assert {name: span.status.status_code for name, span in handled.items()} == {
        "refused": StatusCode.ERROR,
        "raised": StatusCode.ERROR,
        "rejected": StatusCode.ERROR,
    }
    assert {name: (span.attributes or {}).get("error.type") for name, span in handled.items()} == {
        "refused": "refused",
        "raised": "ZeroDivisionError",
        "rejected": "Reject",
    }
    assert {
        name: (span.attributes or {}).get("delayqueue.verdict") for name, span in handled.items()
    } == {"refused": "nack", "raised": "nack", "rejected": "bury"}
    assert [event.name for event in handled["raised"].events] == ["exception"]


def _reject(message: Message) -> None:
    raise Reject("no such order")


def test_a_failed_send_marks_its_span(settings: Any, spans: InMemorySpanExporter) -> None:
    settings.DELAYQUEUES = {"default": {"URL": f"redis://127.0.0.1:{free_port()}/0"}}

    with pytest.raises(QueueUnavailable):
        get_queue("default").send("lost")

    sent = _one(spans, SpanKind.PRODUCER)
    assert sent.status.status_code is StatusCode.ERROR
    assert (sent.attributes or {}).get("error.type") == "QueueUnavailable"


def test_an_unsampled_send_stores_the_message_as_before(
    redis_queue: Queue, spans: InMemorySpanExporter
) -> None:
    unsampled = NonRecordingSpan(
        SpanContext(trace_id=1, span_id=1, is_remote=False, trace_flags=TraceFlags(0))
    )
    with trace.use_span(unsampled):
        message_id = redis_queue.send({"a": 1}, delay=60)

    assert spans.get_finished_spans() == ()
    assert _stored(redis_queue, message_id) == b'~{"a":1}'


def test_a_traced_message_is_stored_with_its_traceparent_first(
    redis_queue: Queue, spans: InMemorySpanExporter
) -> None:
    message_id = redis_queue.send({"a": 1}, delay=60)

    sent = _one(spans, SpanKind.PRODUCER)
    assert _stored(redis_queue, message_id) == f'~^{_traceparent(sent)}^{{"a":1}}'.encode()
    assert redis_queue.peek_payload(message_id) == b'{"a":1}'


def test_without_the_api_nothing_is_traced_and_traced_messages_still_decode() -> None:
    """A worker without the otel extra still handles what a traced producer sent."""
    script = """
import sys
sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
import django
from django.conf import settings
settings.configure()
from delayqueue_django.core import tracing
from delayqueue_django.engine.records import split_trace
import delayqueue_django.core.queue, delayqueue_django.worker.handling
assert not tracing.ENABLED
assert not [name for name in sys.modules if name.startswith("opentelemetry") and sys.modules[name]]
print(split_trace("^00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01^[1]"))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == (
        "('00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', '[1]')"
    )


def test_with_the_api_but_no_provider_there_are_no_spans_until_one_is_set() -> None:
    """The API installed (by another package, say) and no SDK: sends and handler calls make
    no spans, not even no-op ones; once the project sets a provider, the next ones do
    (within a second)."""
    script = """
import time
import django
from django.conf import settings
settings.configure(
    INSTALLED_APPS=["delayqueue_django"],
    DELAYQUEUES={"default": {"URL": "memory://", "HANDLER": "json.dumps"}},
)
django.setup()
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from delayqueue_django import get_queue
from delayqueue_django.core import tracing
from delayqueue_django.worker.handling import call_handler

def send_and_handle():
    queue = get_queue()
    queue.send({"n": 1})
    [message] = queue.fetch(10).messages
    outcome = call_handler(lambda message: None, message, manage_connections=False)
    queue.ack([message])
    return message, outcome

assert tracing.ENABLED and not tracing.active()
message, outcome = send_and_handle()
assert message.traceparent == "" and outcome.verdict.value == "ack"
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
# A "no" is kept for up to LOOK_AGAIN_SECONDS (see tracing.active): then it is found.
time.sleep(tracing.LOOK_AGAIN_SECONDS)
assert tracing.active()
message, outcome = send_and_handle()
assert message.traceparent != "" and outcome.verdict.value == "ack"
print(sorted(span.name for span in exporter.get_finished_spans()))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['process default', 'send default']"


@pytest.mark.django_db(transaction=True)
def test_a_message_sent_through_the_outbox_keeps_its_trace(
    settings: Any, spans: InMemorySpanExporter
) -> None:
    settings.DELAYQUEUE_OUTBOX_DATABASES = ["default"]
    queue = get_queue("default")
    with transaction.atomic():
        queue.send({"order": 1}, outbox=True)
    assert OutboxRelay([queue], databases=["default"]).drain() == 1

    sent = _one(spans, SpanKind.PRODUCER)
    message = _fetch_one(queue)
    assert message.payload == {"order": 1}
    assert message.traceparent == _traceparent(sent)


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no words for it")


def _unprintable(message: Message) -> None:
    raise _Unprintable()


def test_a_handler_raising_an_unprintable_exception_is_a_nack_while_traced(
    spans: InMemorySpanExporter,
) -> None:
    """Nothing a handler does escapes call_handler: its exception's str() failing while the
    span records it must not take the handler thread down (the delivery would never be
    committed, the thread lost for good)."""
    queue = get_queue()
    queue.send("x")
    outcome = call_handler(_unprintable, _fetch_one(queue), manage_connections=False)
    assert outcome.verdict is Verdict.NACK
    assert isinstance(outcome.error, _Unprintable)


def test_a_worker_goes_on_after_a_traced_handler_raised_an_unprintable_exception(
    spans: InMemorySpanExporter,
) -> None:
    import threading

    from delayqueue_django.worker import Worker

    handled: list[str] = []

    def handler(message: Message) -> None:
        handled.append(message.payload)
        if message.payload == "bad":
            raise _Unprintable()

    queue = get_queue()
    queue.send("bad")
    worker = Worker([(queue, handler)], concurrency=1)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        # Wait on the committed totals, not on "unack": right after the send nothing is
        # leased yet, and verdicts are committed in batches after the handler returns.
        wait_for(lambda: queue.stats()["failed_total"], timeout=10, what="the refusal")
        queue.send("good")
        # The one handler thread lives on to handle and ack the next message.
        wait_for(lambda: queue.stats()["acked_total"], timeout=10, what="the next ack")
        assert "good" in handled
    finally:
        worker.request_stop()
        runner.join(timeout=10)
    assert not runner.is_alive()
