"""System checks: static (no Redis needed), with stable ids and exact messages."""

from typing import Any

import pytest
from django.core.checks import Error, Warning
from django.core.management import call_command

from delayqueue_django.checks import check_delayqueues, check_metrics_token


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
                    "OPTIONS": {"socket_timeout": 5},
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
    ],
)
def test_each_problem_has_its_id_and_message(
    settings: Any, value: Any, expected: tuple[str, str]
) -> None:
    assert messages(value, settings) == [expected]


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


@pytest.mark.django_db(transaction=True)
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
