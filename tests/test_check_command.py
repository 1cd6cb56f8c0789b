"""``manage.py delayqueue_check``: a verdict per queue, the problems, and exit codes."""

from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from delayqueue_django import get_queue


def check(*args: str, **options: Any) -> str:
    out = StringIO()
    call_command("delayqueue_check", *args, stdout=out, **options)
    return out.getvalue()


def test_healthy_queues_pass_with_their_counts() -> None:
    get_queue().send("later", delay=60)
    get_queue().send("now")
    assert check().splitlines() == [
        "default: ok; 2 messages (pending 2, ready 0, unack 0, retry 0, garbage 0)",
        "other: ok; 0 messages (pending 0, ready 0, unack 0, retry 0, garbage 0)",
    ]


def test_problems_are_listed_and_exit_3(redis_server: Any) -> None:
    queue = get_queue()
    key = queue.store.keys.key
    raw = redis_server.client()
    for n in range(3):
        raw.hset(key("payload"), f"orphan-{n}", "{}")
    out = StringIO()
    with pytest.raises(CommandError, match="problems found in default") as caught:
        call_command("delayqueue_check", "default", "--show", "2", stdout=out)
    assert caught.value.returncode == 3
    assert out.getvalue().splitlines() == [
        "default: 3 problem(s); 3 messages (pending 0, ready 0, unack 0, retry 0, garbage 0)",
        "  orphan-payload: orphan-0: a payload for a message in no state",
        "  orphan-payload: orphan-1: a payload for a message in no state",
        "  ... and 1 more",
    ]


def test_damage_set_aside_is_noted_without_failing(redis_server: Any) -> None:
    queue = get_queue()
    broken = queue.send("x")
    redis_server.client().hdel(queue.store.keys.key("payload"), broken)
    queue.fetch(1)
    assert "note: 1 dead letter(s) lack a readable payload or meta record" in check("default")


def test_unreachable_redis_exits_1(settings: Any) -> None:
    settings.DELAYQUEUES = {
        "default": {"URL": "redis://127.0.0.1:1/0", "OPTIONS": {"socket_connect_timeout": 0.5}}
    }
    out = StringIO()
    with pytest.raises(CommandError, match="Redis unavailable for default") as caught:
        call_command("delayqueue_check", stdout=out)
    assert caught.value.returncode == 1
    assert out.getvalue().startswith("default: Redis unavailable: ")


def test_an_unknown_queue_is_a_command_error() -> None:
    with pytest.raises(CommandError, match="no queue named 'nope'"):
        check("nope")
