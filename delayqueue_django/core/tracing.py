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

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
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

# How long active() keeps a "no tracer provider" before asking the API again.
LOOK_AGAIN_SECONDS = 1.0

if ENABLED:
    _tracer = trace.get_tracer("delayqueue_django")
    _propagator = TraceContextTextMapPropagator()
    # What get_tracer_provider() gives while no SDK is set: their tracers' spans record
    # nothing, set no context and carry none.
    _NO_OP_PROVIDERS = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    _provider_set = False
    # While none is set, when active() may next ask the API again (time.monotonic()).
    _next_look = 0.0

    def active() -> bool:
        """Whether spans can record: a tracer provider has been set. Without one (the API
        installed by some other dependency, no SDK configured) a span would still cost a
        few µs per message for nothing. A provider once set stays for the life of the
        process (the API refuses to replace it), so a yes is kept, not asked again. A no is
        kept for LOOK_AGAIN_SECONDS: the API's answer reads os.environ each time while no
        provider is set (about 1 µs, more with a larger environment, on every send and
        every handled message), and a provider set later is still found within that time
        (look_again() finds it at once)."""
        global _provider_set, _next_look
        if _provider_set:
            return True
        now = time.monotonic()
        if now < _next_look:
            return False
        _provider_set = not isinstance(trace.get_tracer_provider(), _NO_OP_PROVIDERS)
        _next_look = now + LOOK_AGAIN_SECONDS
        return _provider_set

    def look_again() -> None:
        """Make the next active() ask the API, as after setting a provider that must trace
        the very next send (tests; a project sets its provider at startup)."""
        global _next_look
        _next_look = 0.0

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
        # (Every field carried over: a keyed message's key and hold, a group, an expiry.)
        return [replace(m, payload=mark + m.payload) for m in prepared]

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

    def look_again() -> None:
        """Nothing to look for without the API."""
