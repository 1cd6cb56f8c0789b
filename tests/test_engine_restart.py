"""A Redis that forgot the queue's Lua (restart, failover; FUNCTION FLUSH: see
test_engine_functions) is served again at once; and any JSON value round-trips exactly, on
every store."""

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delayqueue_django.core.queue import Queue
from tests.helpers import fetch_when_due
from tests.redis_servers import RedisServer


def test_the_queue_works_again_after_a_redis_restart() -> None:
    server = RedisServer()
    try:
        from django.test import override_settings

        from delayqueue_django import get_queue

        with override_settings(DELAYQUEUES={"default": {"URL": server.url}}):
            queue = get_queue()
            queue.send("before the restart")
            server.restart()  # no persistence: the data and the library are gone
            message_id = queue.send("after the restart")
            [message] = fetch_when_due(queue)
            assert message.id == message_id
    finally:
        server.close()


# Any text UTF-8 can carry: lone surrogates are refused by send (tested in test_api).
utf8_text = st.text(st.characters(exclude_categories=["Cs"]))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | utf8_text,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(utf8_text, children, max_size=5)
    ),
    max_leaves=20,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(payload=json_values)
def test_any_json_value_round_trips_exactly(queue: Queue, payload: Any) -> None:
    message_id = queue.send(payload)
    [message] = queue.fetch(1).messages
    assert message.id == message_id
    assert message.payload == payload
    queue.ack([message])
