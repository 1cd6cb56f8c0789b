"""Bad input fuzzing of ``send``: whatever it is given, it raises one of the package's errors
(and writes nothing), or the message makes a correct round trip through Redis to a consumer;
the queue's invariants hold after every example."""

import json
from dataclasses import dataclass
from datetime import UTC, date, timedelta, timezone
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import delayqueue_django as delayqueue
from delayqueue_django.exceptions import DelayQueueError
from tests.redis_servers import RedisServer

MAX_PAYLOAD_BYTES = 64 * 1024

odd_text = st.text(
    st.characters(codec=None, exclude_categories=[])  # every code point, lone surrogates too
    | st.sampled_from(["\x00", "\u202e", "\ufeff", "\U0010ffff", "\u0301", "\ud800", "\udfff"]),
    max_size=30,
)
huge_text = st.integers(MAX_PAYLOAD_BYTES - 10, MAX_PAYLOAD_BYTES + 10).map(
    lambda n: "é" * (n // 2)
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**200), max_value=2**200)
    | st.floats()  # NaN and the infinities included
    | odd_text
    | st.datetimes(timezones=st.none() | st.just(UTC))
    | st.decimals(allow_nan=True)
    | st.uuids()
    | st.binary(max_size=5)  # JSON cannot carry bytes
    | st.builds(object)
)


@dataclass(frozen=True)
class Nested:
    """A payload of lists nested ``depth`` deep, built in the test: hypothesis prints its
    arguments, which it cannot do for a structure this deep."""

    depth: int

    def build(self) -> Any:
        value: Any = "bottom"
        for _ in range(self.depth):
            value = [value]
        return value


payloads = (
    st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=4)
            | st.tuples(children, children)
            | st.frozensets(st.integers(), max_size=2)
            | st.dictionaries(odd_text | st.integers() | st.booleans(), children, max_size=4)
        ),
        max_leaves=12,
    )
    | huge_text
    | st.integers(1, 5000).map(Nested)
)
delays = (
    st.none()
    | st.floats()
    | st.integers(min_value=-(2**70), max_value=2**1100)
    | st.timedeltas()
    | st.booleans()
    | odd_text
)
moments = (
    st.none()
    | st.datetimes(timezones=st.none() | st.just(UTC) | st.just(timezone(timedelta(hours=-11))))
    | st.dates()
    | st.floats()
)
# Timing as send is usually called (neither, or one of the two), sometimes both.
timings: st.SearchStrategy[dict[str, Any]] = (
    st.just({})
    | delays.map(lambda delay: {"delay": delay})
    | moments.map(lambda at: {"at": at})
    | st.fixed_dictionaries({"delay": delays, "at": moments})
)
retry_counts = st.none() | st.integers(0, 1000) | st.integers(-5, 1005) | st.booleans() | odd_text
queues = st.sampled_from(["default", "default", "other"]) | odd_text


def normalised(payload: Any) -> Any:
    """What a consumer should get: the payload as JSON (tuples become lists, datetimes and
    keys strings)."""
    return json.loads(json.dumps(payload, cls=DjangoJSONEncoder))


def names_a_key_twice(text: str) -> bool:
    """Whether an object of the JSON text has a key twice, of which decoding keeps one."""
    twice = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal twice
        twice = twice or len({key for key, _ in items}) < len(items)
        return dict(items)

    json.loads(text, object_pairs_hook=pairs)
    return twice


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# The inputs the issue names are always tried, whatever hypothesis draws.
@example(payload=float("nan"), timing={}, retry_count=None, queue_name="default")
@example(payload=[float("inf")], timing={}, retry_count=None, queue_name="default")
@example(payload={"s": "\ud800"}, timing={}, retry_count=None, queue_name="default")
@example(payload=Nested(980), timing={}, retry_count=None, queue_name="default")
@example(payload=Nested(3000), timing={}, retry_count=None, queue_name="default")
@example(payload="x" * 70_000, timing={}, retry_count=None, queue_name="default")
@example(
    payload="\x00\u202e\U0010ffff", timing={"delay": 10**400}, retry_count=None, queue_name="x"
)
@example(payload=1, timing={"delay": 1e306}, retry_count=True, queue_name="default")
@example(payload=1, timing={"at": date(2020, 1, 1)}, retry_count=-1, queue_name="default")
@example(payload={"k": [{1: "a", "1": "b"}]}, timing={}, retry_count=None, queue_name="default")
@given(payload=payloads, timing=timings, retry_count=retry_counts, queue_name=queues)
def test_send_refuses_clearly_or_delivers_exactly(
    redis_server: RedisServer,
    payload: Any,
    timing: dict[str, Any],
    retry_count: Any,
    queue_name: str,
) -> None:
    from django.test import override_settings

    limits = {"MAX_PAYLOAD_BYTES": MAX_PAYLOAD_BYTES}
    queues = {name: {"URL": redis_server.url, **limits} for name in ("default", "other")}
    if isinstance(payload, Nested):
        payload = payload.build()
    with override_settings(DELAYQUEUES=queues):
        refusal: DelayQueueError | None = None
        try:
            message_id = delayqueue.send(
                payload, **timing, retry_count=retry_count, queue=queue_name
            )
        except DelayQueueError as error:
            refusal = error
        if refusal is not None:
            event(f"refused: {type(refusal).__name__}")
            assert str(refusal)  # it says what is wrong
            assert redis_server.client().dbsize() == 0  # and wrote nothing
            return
        event("delivered")
        queue = delayqueue.get_queue(queue_name)
        stored = queue.peek(message_id)
        assert stored is not None
        assert stored.state == "pending"
        assert stored.payload is not None
        assert not names_a_key_twice(stored.payload)  # nothing of it would be lost
        assert stored.budget == (queue.config.retry_count if retry_count is None else retry_count)
        queue.deliver_now([message_id])
        [message] = queue.fetch(10).messages
        assert message.id == message_id
        assert message.payload == normalised(payload)
        assert queue.ack([message]) == {message_id}
        report = queue.check_invariants()
        assert report.ok, report.problems
        assert report.messages == 0
        redis_server.client().flushall()
