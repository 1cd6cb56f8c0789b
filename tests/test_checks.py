"""System checks: static (no Redis needed), with stable ids and exact messages."""

import re
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.checks import Error, Warning
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from delayqueue_django import get_queue
from delayqueue_django.checks import (
    check_delayqueues,
    check_handlers,
    check_metrics_token,
    check_setting_names,
)
from delayqueue_django.core import handlers
from delayqueue_django.engine.keys import QueueKeys
from delayqueue_django.exceptions import QueueConfigurationError


def messages(value: Any, settings: Any) -> list[tuple[str, str]]:
    settings.DELAYQUEUES = value
    return [(m.id or "", m.msg) for m in check_delayqueues()]


def test_a_valid_setting_passes(settings: Any) -> None:
    assert (
        messages(
            {
                "default": {"REDIS": "redis", "HANDLER": "shop.handlers.on_message"},
                "emails": {
                    "URL": "rediss://cache.internal:6380/1",
                    "OPTIONS": {"socket_timeout": 5, "ssl_certfile": "client.pem"},
                    "RETRY_COUNT": 5,
                    "MAX_CONSUME_DURATION": 120,
                    "NACK_REDELIVERY_DELAY": [1, 10.5],
                    "GARBAGE_RETENTION": None,
                },
                "cluster": {"URL": "redis+cluster://10.0.0.1:7000"},
                "local": {"URL": "unix:///run/redis.sock"},
                "in-memory": {"URL": "memory://"},
                "named-memory": {"URL": "memory://tests.shop-1"},
            },
            settings,
        )
        == []
    )


def test_an_empty_setting_warns(settings: Any) -> None:
    settings.DELAYQUEUES = {}
    [warning] = check_delayqueues()
    assert isinstance(warning, Warning)
    assert warning.id == "delayqueue_django.W001"
    assert warning.msg == "delayqueue_django is installed but DELAYQUEUES defines no queue."


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            ["default"],
            (
                "delayqueue_django.E001",
                "DELAYQUEUES must be a dict mapping queue names to options, not list.",
            ),
        ),
        (
            {"bad name": {"URL": "redis://x"}},
            (
                "delayqueue_django.E002",
                "DELAYQUEUES has a queue named 'bad name'; names are 1 to 100 letters, digits and _ . : -",
            ),
        ),
        (
            {"default": "redis://x"},
            (
                "delayqueue_django.E003",
                "DELAYQUEUES['default'] must be a dict of options, not str.",
            ),
        ),
        (
            {"default": {"URL": "redis://x", "RETRIES": 3}},
            ("delayqueue_django.E004", "DELAYQUEUES['default'] has unknown option(s) 'RETRIES'."),
        ),
        (
            {"default": {}},
            (
                "delayqueue_django.E005",
                "DELAYQUEUES['default'] must set exactly one of REDIS (a django-redis cache alias) and URL.",
            ),
        ),
        (
            {"default": {"REDIS": "redis", "URL": "redis://x"}},
            (
                "delayqueue_django.E005",
                "DELAYQUEUES['default'] must set exactly one of REDIS (a django-redis cache alias) and URL.",
            ),
        ),
        (
            {"default": {"REDIS": "nope"}},
            (
                "delayqueue_django.E006",
                "DELAYQUEUES['default']['REDIS'] is 'nope', which is not an alias in CACHES.",
            ),
        ),
        (
            {"default": {"REDIS": "default"}},
            (
                "delayqueue_django.E006",
                "DELAYQUEUES['default']['REDIS'] names cache 'default', whose BACKEND "
                "'django.core.cache.backends.locmem.LocMemCache' is not django-redis.",
            ),
        ),
        (
            {"default": {"URL": "http://x"}},
            (
                "delayqueue_django.E007",
                "DELAYQUEUES['default']['URL'] is 'http://x'; it must start with one of redis://, "
                "rediss://, unix://, redis+cluster://, rediss+cluster://, memory://.",
            ),
        ),
        (
            {"default": {"URL": "memory://no spaces"}},
            (
                "delayqueue_django.E007",
                "DELAYQUEUES['default']['URL'] is 'memory://no spaces'; an in-memory store is "
                "memory:// or memory://name, the name being up to 100 letters, digits and _ . : -",
            ),
        ),
        (
            {"default": {"URL": "memory:default"}},
            (
                "delayqueue_django.E007",
                "DELAYQUEUES['default']['URL'] is 'memory:default'; an in-memory store is "
                "memory:// or memory://name, the name being up to 100 letters, digits and _ . : -",
            ),
        ),
        (
            {"default": {"URL": "redis://x", "HANDLER": "not a path"}},
            (
                "delayqueue_django.E008",
                "DELAYQUEUES['default']['HANDLER'] must be the dotted path of a callable, like "
                "'shop.handlers.on_message'; not 'not a path'.",
            ),
        ),
        (
            {"default": {"URL": "redis://x", "RETRY_COUNT": -1}},
            (
                "delayqueue_django.E009",
                "DELAYQUEUES['default']['RETRY_COUNT'] must be an int from 0 to 1000, not -1.",
            ),
        ),
        (
            {"default": {"URL": "redis://x", "FETCH_BATCH_SIZE": 0}},
            (
                "delayqueue_django.E009",
                "DELAYQUEUES['default']['FETCH_BATCH_SIZE'] must be an int from 1 to 10000, not 0.",
            ),
        ),
        (
            {"default": {"URL": "redis://x", "MAX_PAYLOAD_BYTES": "1MB"}},
            (
                "delayqueue_django.E009",
                "DELAYQUEUES['default']['MAX_PAYLOAD_BYTES'] must be a positive int (at most 512 MiB), not '1MB'.",
            ),
        ),
        (
            {"default": {"URL": "redis://x", "MAX_CONSUME_DURATION": 0}},
            (
                "delayqueue_django.E010",
                "DELAYQUEUES['default']['MAX_CONSUME_DURATION'] must be a positive number of seconds or a "
                "timedelta, not 0.",
            ),
        ),
        (
            {"default": {"URL": "redis://x", "TIME_LIMIT": "1m"}},
            (
                "delayqueue_django.E023",
                "DELAYQUEUES['default']['TIME_LIMIT'] must be a positive number of seconds, a "
                "timedelta or None (no limit), not '1m'.",
            ),
        ),
        (
            {"default": {"URL": "redis://x", "TIME_LIMIT": 30, "MAX_CONSUME_DURATION": 30}},
            (
                "delayqueue_django.E023",
                "DELAYQUEUES['default']['TIME_LIMIT'] (30 s) must be below MAX_CONSUME_DURATION "
                "(30 s).",
            ),
        ),
        (
            {"default": {"URL": "redis://x", "GARBAGE_RETENTION": -5}},
            (
                "delayqueue_django.E010",
                "DELAYQUEUES['default']['GARBAGE_RETENTION'] must be a number of seconds, a timedelta, or "
                "None to keep dead letters until removed by hand; not -5.",
            ),
        ),
        (
            {"default": {"URL": "redis://x", "NACK_REDELIVERY_DELAY": []}},
            (
                "delayqueue_django.E011",
                "DELAYQUEUES['default']['NACK_REDELIVERY_DELAY'] must be seconds (number or timedelta, zero "
                "or more) or a non-empty list of them, one per retry (the last one repeats); not [].",
            ),
        ),
        (
            {"default": {"URL": "redis://x", "KEY_PREFIX": "{tag}"}},
            (
                "delayqueue_django.E012",
                "DELAYQUEUES['default']['KEY_PREFIX'] is '{tag}'; it must be 1 to 100 letters, digits and "
                "_ . : - (braces would break the Redis Cluster hash tag).",
            ),
        ),
        (
            {"default": {"URL": "redis://x", "SEND_ON_COMMIT": "yes"}},
            (
                "delayqueue_django.E014",
                "DELAYQUEUES['default']['SEND_ON_COMMIT'] must be True or False, not 'yes'.",
            ),
        ),
        (
            {"default": {"REDIS": "redis", "OPTIONS": {"socket_timeout": 1}}},
            (
                "delayqueue_django.E013",
                "DELAYQUEUES['default']['OPTIONS'] only applies with URL; a REDIS alias uses the cache's own "
                "connection options.",
            ),
        ),
        (
            {"default": {"URL": "memory://", "OPTIONS": {"socket_timeout": 1}}},
            (
                "delayqueue_django.E013",
                "DELAYQUEUES['default']['OPTIONS'] only applies to a Redis URL; an in-memory store takes "
                "no connection options.",
            ),
        ),
        (
            {"default": {"URL": "redis://x", "OPTIONS": {"socket_timout": 5}}},
            (
                "delayqueue_django.E017",
                "DELAYQUEUES['default']['OPTIONS'] has 'socket_timout', which redis-py's Redis "
                "client does not accept.",
            ),
        ),
        (
            # TLS options take a rediss:// URL (see test_a_valid_setting_passes).
            {"default": {"URL": "redis://x", "OPTIONS": {"ssl_certfile": "client.pem"}}},
            (
                "delayqueue_django.E017",
                "DELAYQUEUES['default']['OPTIONS'] has 'ssl_certfile', which redis-py's Redis "
                "client does not accept.",
            ),
        ),
        (
            # RedisCluster would drop it without a word.
            {"default": {"URL": "redis+cluster://x:7000", "OPTIONS": {"health_check_interval": 5}}},
            (
                "delayqueue_django.E017",
                "DELAYQUEUES['default']['OPTIONS'] has 'health_check_interval', which redis-py's "
                "RedisCluster client does not accept.",
            ),
        ),
    ],
)
def test_each_problem_has_its_id_and_message(
    settings: Any, value: Any, expected: tuple[str, str]
) -> None:
    assert messages(value, settings) == [expected]


def test_a_time_limit_below_the_lease_is_read_in_seconds(settings: Any) -> None:
    settings.DELAYQUEUES = {
        "default": {"URL": "redis://x", "TIME_LIMIT": timedelta(seconds=2.5)},
        "other": {"URL": "redis://x"},
    }
    assert check_delayqueues() == []
    assert get_queue("default").config.time_limit == 2.5
    assert get_queue("other").config.time_limit is None


def test_every_problem_is_reported_at_once(settings: Any) -> None:
    found = messages(
        {"a": {"URL": "ftp://x", "RETRY_COUNT": "3"}, "b": {"REDIS": "missing"}}, settings
    )
    assert [check_id for check_id, _ in found] == [
        "delayqueue_django.E007",
        "delayqueue_django.E009",
        "delayqueue_django.E006",
    ]


def test_errors_carry_hints(settings: Any) -> None:
    settings.DELAYQUEUES = {"default": {"REDIS": "missing"}}
    [error] = check_delayqueues()
    assert isinstance(error, Error)
    assert error.hint == "Cache aliases configured: 'default', 'redis'."


def test_a_misspelt_client_option_is_answered_with_the_right_spelling(settings: Any) -> None:
    settings.DELAYQUEUES = {"default": {"URL": "redis://x", "OPTIONS": {"socket_timout": 5}}}
    [error] = check_delayqueues()
    assert error.hint == "Did you mean 'socket_timeout'?"


@pytest.mark.parametrize(
    ("options", "hint"),
    [
        ({"RATELIMIT": "2/s"}, "Did you mean 'RATE_LIMIT'?"),
        ({"max_in_flight": 3}, "Did you mean 'MAX_IN_FLIGHT'?"),
        (
            {"RATELIMIT": "2/s", "EXPIRE": 60},
            "Did you mean 'EXPIRES' for 'EXPIRE', 'RATE_LIMIT' for 'RATELIMIT'?",
        ),
    ],
)
def test_a_misspelt_queue_option_is_answered_with_the_right_spelling(
    settings: Any, options: dict[str, Any], hint: str
) -> None:
    """Before, the hint listed every option, and the reader had to spot the one meant."""
    settings.DELAYQUEUES = {"default": {"URL": "redis://x", **options}}
    [error] = check_delayqueues()
    assert error.id == "delayqueue_django.E004"
    assert error.hint == hint


def test_an_unknown_queue_option_like_none_lists_them_all(settings: Any) -> None:
    settings.DELAYQUEUES = {"default": {"URL": "redis://x", "COLOUR": "blue"}}
    [error] = check_delayqueues()
    assert error.hint is not None
    assert error.hint.startswith("Known options: REDIS, URL, OPTIONS, HANDLER,")


def test_a_misspelt_and_an_unknown_option_get_both_hints(settings: Any) -> None:
    settings.DELAYQUEUES = {"default": {"URL": "redis://x", "RATELIMIT": "2/s", "COLOUR": 1}}
    [error] = check_delayqueues()
    assert error.hint is not None
    assert error.hint.startswith(
        "Did you mean 'RATE_LIMIT' for 'RATELIMIT'? Known options: REDIS, URL,"
    )


@pytest.mark.parametrize(
    ("name", "message", "hint"),
    [
        (
            "DELAYQUEUE",
            "DELAYQUEUE is not a setting of delayqueue_django: nothing reads it.",
            "Did you mean DELAYQUEUES?",
        ),
        (
            "DELAY_QUEUES",
            "DELAY_QUEUES is not a setting of delayqueue_django: nothing reads it.",
            "Did you mean DELAYQUEUES?",
        ),
        (
            "DELAYQUEUE_OUTBOX_DATABASE",
            "DELAYQUEUE_OUTBOX_DATABASE is not a setting of delayqueue_django: nothing reads it.",
            "Did you mean DELAYQUEUE_OUTBOX_DATABASES?",
        ),
        (
            "DELAYQUEUE_RETRIES",
            "DELAYQUEUE_RETRIES is not a setting of delayqueue_django: nothing reads it.",
            "Its settings are DELAYQUEUES, DELAYQUEUE_OUTBOX_DATABASES and "
            "DELAYQUEUE_METRICS_TOKEN; a queue's options go in DELAYQUEUES[name].",
        ),
    ],
)
def test_a_misspelt_setting_of_the_package_is_noticed(
    settings: Any, name: str, message: str, hint: str
) -> None:
    """Before, a misspelt DELAYQUEUES (or outbox databases) setting went unnoticed but for
    W001's "defines no queue", which did not say why."""
    setattr(settings, name, {"default": {"URL": "redis://x"}})
    [warning] = check_setting_names()
    assert isinstance(warning, Warning)
    assert (warning.id, warning.msg, warning.hint) == ("delayqueue_django.W003", message, hint)


def test_the_packages_own_settings_and_others_pass_the_name_check(settings: Any) -> None:
    settings.DELAYQUEUE_OUTBOX_DATABASES = ["default"]
    settings.DELAYQUEUE_METRICS_TOKEN = "x" * 16
    settings.QUEUES = {}  # another app's: not near enough to be a misspelling
    settings.DELAYED = True
    assert check_setting_names() == []


def test_a_url_redis_py_cannot_read_is_an_error(settings: Any) -> None:
    settings.DELAYQUEUES = {"default": {"URL": "redis://x:port/0"}}
    [error] = check_delayqueues()
    assert error.id == "delayqueue_django.E007"
    assert error.msg.startswith(
        "DELAYQUEUES['default']['URL'] is 'redis://x:port/0', which redis-py cannot read: "
    )


# (Django 6.1's checks ask every database: see test_check_deploy_warns_about_memory_queues.)
@pytest.mark.django_db(transaction=True, databases="__all__")
def test_check_and_migrate_work_with_redis_down(settings: Any) -> None:
    settings.DELAYQUEUES = {"default": {"URL": "redis://127.0.0.1:1/0"}}
    call_command("check", "--fail-level", "WARNING")
    call_command("migrate", "--run-syncdb", verbosity=0)


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        (None, []),
        ("x" * 16, []),
        ("short", ["DELAYQUEUE_METRICS_TOKEN is 5 characters long; use at least 16."]),
        (12345678901234567, ["DELAYQUEUE_METRICS_TOKEN must be a string, not int."]),
    ],
)
def test_the_metrics_token_must_be_long_enough(
    settings: Any, token: Any, expected: list[str]
) -> None:
    settings.DELAYQUEUE_METRICS_TOKEN = token
    errors = check_metrics_token()
    assert [error.msg for error in errors] == expected
    assert all(error.id == "delayqueue_django.E015" for error in errors)


def test_an_unknown_scheme_hints_at_cluster_and_memory_urls(settings: Any) -> None:
    settings.DELAYQUEUES = {"default": {"URL": "http://x"}}
    [error] = check_delayqueues()
    assert error.hint == (
        "redis+cluster://host:port connects to a Redis Cluster; memory:// keeps the queue in "
        "this process, for tests and quick local runs."
    )


# Django 6.1 runs the field checks against every database (asking MariaDB its version):
# a test that runs the system checks needs them all, or it passes only where another test
# asked first.
@pytest.mark.django_db(databases="__all__")
def test_check_deploy_warns_about_memory_queues(settings: Any) -> None:
    from django.core.checks import run_checks

    settings.DELAYQUEUES = {
        "default": {"URL": "memory://"},
        "emails": {"URL": "redis://127.0.0.1:1/0"},
    }
    assert [m.id for m in run_checks() if m.id and m.id.startswith("delayqueue")] == []
    [warning] = [
        m for m in run_checks(include_deployment_checks=True) if m.id == "delayqueue_django.W002"
    ]
    assert isinstance(warning, Warning)
    assert warning.msg == (
        "DELAYQUEUES['default'] keeps its messages in this process's memory (memory://): they "
        "are lost when the process ends, and no other process, no worker included, sees them."
    )
    assert warning.hint == (
        "Give the queue a Redis URL or a REDIS cache alias; memory:// is for tests and quick "
        "local runs."
    )


SHARED_KEYS = (
    "delayqueue_django.E016",
    "DELAYQUEUES['a:b'] (KEY_PREFIX 'dq') and DELAYQUEUES['b'] (KEY_PREFIX 'dq:a') are on the "
    "same server and would share its keys {dq:a:b}:…, and with them every message.",
)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"URL": "redis://10.0.0.5:6379/0"}, {"URL": "redis://10.0.0.5:6379/0"}),
        ({"URL": "memory://"}, {"URL": "memory://"}),
        # A cache alias is where its LOCATION is (the first, for a list of servers).
        ({"REDIS": "shared"}, {"URL": "redis://10.0.0.5:6379/0"}),
        ({"REDIS": "shared"}, {"REDIS": "same-server"}),
    ],
)
def test_two_queues_whose_keys_coincide_on_one_server_are_refused(
    settings: Any, first: dict[str, Any], second: dict[str, Any]
) -> None:
    # Their keys, {KEY_PREFIX:name}:…, are the very same: every message would be shared.
    assert QueueKeys("dq", "a:b").tag == QueueKeys("dq:a", "b").tag
    settings.CACHES = {
        **settings.CACHES,
        "shared": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://10.0.0.5:6379/0,redis://10.0.0.6:6379/0",
        },
        "same-server": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": ["redis://10.0.0.5:6379/0"],
        },
    }
    value = {"a:b": {**first, "KEY_PREFIX": "dq"}, "b": {**second, "KEY_PREFIX": "dq:a"}}
    assert messages(value, settings) == [SHARED_KEYS]
    with pytest.raises(QueueConfigurationError, match=re.escape(": ".join(SHARED_KEYS))):
        get_queue("a:b")


def test_the_default_prefix_can_coincide_too(settings: Any) -> None:
    value = {"x:y": {"URL": "memory://"}, "y": {"URL": "memory://", "KEY_PREFIX": "delayqueue:x"}}
    [(check_id, message)] = messages(value, settings)
    assert check_id == "delayqueue_django.E016"
    assert "would share its keys {delayqueue:x:y}:…" in message


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"URL": "redis://10.0.0.5:6379/0"}, {"URL": "redis://10.0.0.5:6379/1"}),
        ({"URL": "memory://one"}, {"URL": "memory://two"}),
        ({"REDIS": "redis"}, {"URL": "redis://10.0.0.5:6379/0"}),
    ],
)
def test_queues_on_different_servers_may_share_a_key_tag(
    settings: Any, first: dict[str, Any], second: dict[str, Any]
) -> None:
    value = {"a:b": {**first, "KEY_PREFIX": "dq"}, "b": {**second, "KEY_PREFIX": "dq:a"}}
    assert messages(value, settings) == []


# HANDLER: imported by the check, as the worker will import it.

HANDLERS_PACKAGE = "checked_app"


@pytest.fixture
def handler_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package ``checked_app`` on the path, with a working ``handlers`` module; tests add
    modules of their own. Forgotten afterwards, so each test imports afresh."""
    package = tmp_path / HANDLERS_PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "handlers.py").write_text(
        "LIMIT = 3\n\n\ndef on_message(message):\n    return None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for name in [m for m in sys.modules if m.partition(".")[0] == HANDLERS_PACKAGE]:
        del sys.modules[name]


def handler_problems(path: str, settings: Any) -> list[tuple[str, str, str]]:
    settings.DELAYQUEUES = {"emails": {"URL": "redis://x", "HANDLER": path}}
    return [(m.id or "", m.msg, m.hint or "") for m in check_handlers()]


def test_a_handler_that_imports_and_is_callable_passes(
    handler_modules: Path, settings: Any
) -> None:
    assert handler_problems("checked_app.handlers.on_message", settings) == []


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (
            "mail.handlers.send",
            (
                "delayqueue_django.E020",
                "DELAYQUEUES['emails']['HANDLER'] is 'mail.handlers.send', but there is no module 'mail'.",
                "Check the spelling, or create mail/handlers.py holding the handler: def send(message): ...",
            ),
        ),
        (
            "checked_app.handler.on_message",
            (
                "delayqueue_django.E020",
                "DELAYQUEUES['emails']['HANDLER'] is 'checked_app.handler.on_message', but there is no module 'checked_app.handler'.",
                "Did you mean 'checked_app.handlers.on_message'?",
            ),
        ),
        (
            "checked_app.handlers.on_mesage",
            (
                "delayqueue_django.E020",
                "DELAYQUEUES['emails']['HANDLER'] is 'checked_app.handlers.on_mesage', but module 'checked_app.handlers' has no attribute 'on_mesage'.",
                "Did you mean 'checked_app.handlers.on_message'?",
            ),
        ),
        (
            "checked_app.handlers.LIMIT",
            (
                "delayqueue_django.E021",
                "DELAYQUEUES['emails']['HANDLER'] is 'checked_app.handlers.LIMIT', which is not callable (of type int).",
                "Point HANDLER at a function taking the message: def LIMIT(message): ...",
            ),
        ),
    ],
)
def test_a_handler_that_cannot_be_found_is_an_error_with_a_hint(
    handler_modules: Path, settings: Any, path: str, expected: tuple[str, str, str]
) -> None:
    assert handler_problems(path, settings) == [expected]


def test_a_missing_handler_function_is_answered_with_where_to_define_it(
    handler_modules: Path, settings: Any
) -> None:
    assert handler_problems("checked_app.handlers.ship_parcel", settings) == [
        (
            "delayqueue_django.E020",
            "DELAYQUEUES['emails']['HANDLER'] is 'checked_app.handlers.ship_parcel', but module 'checked_app.handlers' has no attribute 'ship_parcel'.",
            f"Define it in {handler_modules / 'handlers.py'}: def ship_parcel(message): ...",
        )
    ]


@pytest.mark.parametrize(
    ("source", "raised"),
    [
        ("x = 1 / 0\n", "ZeroDivisionError: division by zero"),
        (
            "import a_dependency_not_installed\n",
            "ModuleNotFoundError: No module named 'a_dependency_not_installed'",
        ),
        ("def on_message(message)\n", "SyntaxError: expected ':'"),
        ("raise SystemExit(3)\n", "SystemExit: 3"),
    ],
)
def test_a_handler_module_that_raises_on_import_is_an_error_not_a_crash(
    handler_modules: Path, settings: Any, source: str, raised: str
) -> None:
    (handler_modules / "broken.py").write_text(source)
    [(check_id, message, hint)] = handler_problems("checked_app.broken.on_message", settings)
    assert check_id == "delayqueue_django.E020"
    assert message.startswith(
        "DELAYQUEUES['emails']['HANDLER'] is 'checked_app.broken.on_message', but importing "
        f"'checked_app.broken' raised {raised}"
    )
    assert hint == (
        'Fix that module; python manage.py shell -c "import checked_app.broken" shows the traceback.'
    )


# Django 6.1 runs the field checks against every database (asking MariaDB its version):
# a test that runs the system checks needs them all, or it passes only where another test
# asked first.
@pytest.mark.django_db(databases="__all__")
def test_manage_py_check_reports_the_handler(handler_modules: Path, settings: Any) -> None:
    settings.DELAYQUEUES = {"emails": {"URL": "redis://x", "HANDLER": "checked_app.handlers.nope"}}
    with pytest.raises(SystemCheckError, match=re.escape("(delayqueue_django.E020)")):
        call_command("check")


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("def on_message():\n    pass\n", "too many positional arguments"),
        ("def on_message(message, extra):\n    pass\n", "missing a required argument: 'extra'"),
    ],
)
def test_a_handler_that_cannot_take_the_message_is_an_error(
    handler_modules: Path, settings: Any, source: str, why: str
) -> None:
    (handler_modules / "odd.py").write_text(source)
    assert handler_problems("checked_app.odd.on_message", settings) == [
        (
            "delayqueue_django.E022",
            "DELAYQUEUES['emails']['HANDLER'] is 'checked_app.odd.on_message', which cannot be "
            f"called with the message alone ({why}).",
            "A handler takes one argument, the message: def on_message(message): ...",
        )
    ]


def test_handlers_taking_the_message_in_any_form_pass(handler_modules: Path, settings: Any) -> None:
    (handler_modules / "forms.py").write_text(
        "def anything(*args, **kwargs):\n    pass\n\n\n"
        "def defaulted(message, retries=3):\n    pass\n\n\n"
        "class Handler:\n    def __call__(self, message):\n        pass\n\n\n"
        "instance = Handler()\n"
    )
    for name in ("anything", "defaulted", "instance"):
        assert handler_problems(f"checked_app.forms.{name}", settings) == [], name


def test_a_decorated_handler_that_cannot_take_the_message_is_an_error(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_arguments() -> None:
        pass

    monkeypatch.setitem(handlers._registered, "emails", no_arguments)
    settings.DELAYQUEUES = {"emails": {"URL": "redis://x"}, "mute": {"URL": "redis://x"}}
    assert [(m.id, m.msg) for m in check_handlers()] == [
        (
            "delayqueue_django.E022",
            "the @delayqueue_django.handler('emails') function tests.test_checks."
            "test_a_decorated_handler_that_cannot_take_the_message_is_an_error.<locals>."
            "no_arguments cannot be called with the message alone (too many positional "
            "arguments).",
        )
    ]  # and nothing about 'mute': a queue consumed by hand needs no handler
