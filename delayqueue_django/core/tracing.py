"""OpenTelemetry tracing: a producer span per send call, a consumer span per handler call.

Active only when ``opentelemetry-api`` is installed (the ``otel`` extra) and a tracer provider
is set (an SDK's): this module checks for the API once, at import, and defines its spans only
then; callers ask ``active()`` first. A message carries
the W3C ``traceparent`` of the span that sent it only when that span is recording (an SDK
is configured and sampled it): as a prefix of its stored payload, ``^<traceparent>^``, which
JSON text never starts with, so an untraced message is stored exactly as before. The prefix
is taken off (``engine.records.split_trace``) wherever a payload is read back, with or
without the API.
"""

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from delayqueue_django.core.message import Message
from delayqueue_django.engine import NewMessage
from delayqueue_django.engine.records import TRACE_MARK

try:
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the otel extra is not installed: tracing is off, at no cost
    trace = None  # type: ignore[assignment]

ENABLED = trace is not None

# The messaging semantic conventions' name for a system they do not list is the
# instrumentation's own: this app, whatever Redis server it runs on.
MESSAGING_SYSTEM = "delayqueue_django"

if ENABLED:
    _tracer = trace.get_tracer("delayqueue_django")
    _propagator = TraceContextTextMapPropagator()
    # What get_tracer_provider() gives while no SDK is set: their tracers' spans record
    # nothing, set no context and carry none.
    _NO_OP_PROVIDERS = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    _provider_set = False

    def active() -> bool:
        """Whether spans can record: a tracer provider has been set. Without one (the API
        installed by some other dependency, no SDK configured) a span would still cost a
        few µs per message for nothing. A provider once set stays for the life of the
        process (the API refuses to replace it), so a yes is kept, not asked again."""
        global _provider_set
        if not _provider_set:
            _provider_set = not isinstance(trace.get_tracer_provider(), _NO_OP_PROVIDERS)
        return _provider_set

    @contextmanager
    def producer_span(
        queue: str, prepared: list[NewMessage], *, batch: bool
    ) -> Iterator[list[NewMessage]]:
        """One ``send <queue>`` span around a send call; yields the messages to write,
        stamped with the span's trace context when it records."""
        attributes: dict[str, str | int] = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.destination.name": queue,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }
        if batch:
            attributes["messaging.batch.message_count"] = len(prepared)
        else:
            attributes["messaging.message.id"] = prepared[0].id
        with _tracer.start_as_current_span(
            f"send {queue}", kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            # The SDK records the exception and the error status; the conventions also ask
            # for error.type.
            try:
                yield _stamped(prepared, span)
            except BaseException as error:
                span.set_attribute("error.type", type(error).__qualname__)
                raise

    def _stamped(prepared: list[NewMessage], span: Any) -> list[NewMessage]:
        """The messages carrying the span's traceparent before their payloads, when the span
        records (else as they are: an unsampled send stores nothing more)."""
        if not span.is_recording():
            return prepared
        carrier: dict[str, str] = {}
        _propagator.inject(carrier)
        traceparent = carrier.get("traceparent")
        if not traceparent:
            return prepared
        mark = f"{TRACE_MARK}{traceparent}{TRACE_MARK}"
        # (Every field carried over: a keyed message's key, if_exists and hold too.)
        return [
            NewMessage(
                m.id,
                mark + m.payload,
                m.budget,
                m.at_ms,
                m.delay_us,
                m.key,
                m.if_exists,
                m.unique_ms,
            )
            for m in prepared
        ]

    @contextmanager
    def consumer_span(message: Message) -> Iterator[Any]:
        """A ``process <queue>`` span around one handler call: a child of the span that sent
        the message (and linked to it, as the conventions ask of a creation context)."""
        parent = None
        links: Sequence[Link] = ()
        if message.traceparent:
            parent = _propagator.extract({"traceparent": message.traceparent})
            sent_by = trace.get_current_span(parent).get_span_context()
            if sent_by.is_valid:
                links = (Link(sent_by),)
        attributes: dict[str, str | int] = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.destination.name": message.queue,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.message.id": message.id,
            "messaging.message.delivery_attempt": message.attempt,
        }
        with _tracer.start_as_current_span(
            f"process {message.queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
            # The handler's exceptions never escape call_handler: the outcome says how it went.
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span

    def record_outcome(span: Any, verdict: str, error: BaseException | None) -> None:
        """The handler's verdict (the worker's ``Verdict`` value) on its span, and its error
        as the span's error."""
        span.set_attribute("delayqueue.verdict", verdict)
        if error is not None:
            try:
                description = str(error)
                span.record_exception(error)  # (str()s it too)
            except Exception:
                # An exception whose str() fails must not escape call_handler (it would
                # take the handler thread down, its delivery never committed).
                description = f"<{type(error).__qualname__}: str() failed>"
            span.set_attribute("error.type", type(error).__qualname__)
            span.set_status(Status(StatusCode.ERROR, description))
        elif verdict == "nack":
            span.set_attribute("error.type", "refused")
            span.set_status(Status(StatusCode.ERROR, "the handler returned False"))

else:

    def active() -> bool:
        return False
