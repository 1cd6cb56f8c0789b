"""The worker's per-message shortcuts: records built without their frozen __init__
(engine.quick_records), and the connection check skipped where it has nothing to look at."""

import dataclasses
import pickle
import threading
from typing import Any

import pytest
from django.db import connections

from delayqueue_django.core.message import Message
from delayqueue_django.engine.quick_records import quick
from delayqueue_django.engine.records import Delivery
from delayqueue_django.worker import handling
from delayqueue_django.worker.handling import Outcome, Verdict, call_handler


def a_message(**changes: Any) -> Message:
    fields = ("id-1", "q", {"n": 1}, 2, 3, 17, 1_000, 900, "00-ab-cd-01", "k", 5, "g", False)
    return dataclasses.replace(Message(*fields), **changes)


@pytest.mark.parametrize("cls", [Message, Delivery, Outcome])
def test_a_quick_record_is_the_record_built_as_usual(cls: type[Any]) -> None:
    values: dict[type[Any], tuple[Any, ...]] = {
        Message: dataclasses.astuple(a_message()),
        Delivery: ("id", "{}", 1, 2, 3, 4, 5, "", "key", 6, "group", False),
        Outcome: (a_message(), Verdict.NACK, ValueError("x"), 0.5, 100, True),
    }
    args = values[cls]
    names = [field.name for field in dataclasses.fields(cls)]
    usual, built = cls(*args), quick(cls)(*args)
    assert type(built) is cls
    assert isinstance(built, cls)
    assert [getattr(built, name) for name in names] == list(args)
    assert built == usual
    assert repr(built) == repr(usual)
    assert quick(cls)(**dict(zip(names, args, strict=True))) == usual
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(built, names[0], "changed")
    assert dataclasses.replace(built, **{names[0]: args[0]}) == usual


def test_a_quick_record_takes_the_defaults_and_pickles_as_the_record() -> None:
    built = quick(Message)("id-1", "q", None, 1, 0, 1, 2, 3)
    assert built == Message("id-1", "q", None, 1, 0, 1, 2, 3)
    assert (built.traceparent, built.key, built.tracked) == ("", None, True)
    assert pickle.loads(pickle.dumps(built)) == built


def test_quick_refuses_what_it_would_build_wrong() -> None:
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class Made:
        a: list[int] = dataclasses.field(default_factory=list)

    for cls in (NoSlots, Checked, Made):
        with pytest.raises(TypeError):
            quick(cls)


def in_new_thread(run: Any) -> None:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            run()
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def test_a_thread_without_a_connection_skips_django_s_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    looks: list[str] = []
    monkeypatch.setattr(handling, "close_stale_connections", lambda: looks.append("look"))

    def run() -> None:
        assert connections.all(initialized_only=True) == []
        handling.close_old_connections()
        assert looks == []
        connections["default"]  # initialized (not connected): now there is one to look at
        handling.close_old_connections()
        assert looks == ["look"]

    in_new_thread(run)


@pytest.mark.django_db(transaction=True)
def test_a_handler_s_connection_past_conn_max_age_is_closed_after_it() -> None:
    # CONN_MAX_AGE is 0 in the tests' settings: a connection lasts one handler call, as it
    # lasts one request.
    seen: dict[str, Any] = {}

    def handler(message: Message) -> None:
        connection = connections["default"]
        connection.ensure_connection()
        seen["connection"] = connection

    def run() -> None:
        outcome = call_handler(handler, a_message())
        assert outcome.verdict is Verdict.ACK
        assert seen["connection"].connection is None  # closed, as after a request
        # Nothing initialized in a thread stays nothing: the shortcut takes nothing away.
        assert connections.all(initialized_only=True) == [seen["connection"]]

    in_new_thread(run)


@pytest.mark.django_db(transaction=True)
def test_a_handler_s_broken_connection_is_closed_after_it() -> None:
    seen: dict[str, Any] = {}

    def handler(message: Message) -> None:
        connection = connections["default"]
        connection.ensure_connection()
        connection.close_at = None  # as with CONN_MAX_AGE=None: kept, unless broken
        connection.errors_occurred = True
        connection.is_usable = lambda: False  # type: ignore[method-assign]
        seen["connection"] = connection

    def run() -> None:
        call_handler(handler, a_message())
        assert seen["connection"].connection is None

    in_new_thread(run)
