"""System checks for DELAYQUEUES. Static: they never contact Redis, so ``migrate`` and
``check`` work with Redis down."""

import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError, connections
from django.utils.module_loading import import_string

from delayqueue_django.core import conf, handlers
from delayqueue_django.core.conf.loop import (
    DEFAULT_LOOP_BLOCKED_AFTER,
    LOOP_BLOCKED_AFTER_SETTING,
    loop_blocked_after_problem,
)
from delayqueue_django.core.conf.problem import SETTING
from delayqueue_django.core.conf.queue_config import QueueConfig
from delayqueue_django.core.conf.spelling import folded, meant
from delayqueue_django.exceptions import QueueConfigurationError
from delayqueue_django.outbox import table as outbox_table
from delayqueue_django.outbox.databases import (
    OUTBOX_DATABASES_SETTING,
    outbox_databases,
    outbox_databases_problem,
)
from delayqueue_django.schedules.option import declared_schedules
from delayqueue_django.tasks.claims import task_queue_names


@register()
def check_delayqueues(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    value = conf.raw_setting()
    if isinstance(value, dict) and not value:
        return [
            Warning(
                "delayqueue_django is installed but DELAYQUEUES defines no queue.",
                hint='Add e.g. DELAYQUEUES = {"default": {"REDIS": "default", '
                '"HANDLER": "myapp.handlers.on_message"}}.',
                id="delayqueue_django.W001",
            )
        ]
    _, problems = conf.parse(value)
    return [Error(problem.msg, hint=problem.hint, id=problem.id) for problem in problems]


@register()
def check_handlers(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Each queue's handler imports, is callable and takes the message, as the worker will
    need it. Importing runs the handler's module, as Django's own checks import URLconfs;
    what it raises is reported. A queue with no handler at all is not an error here: one
    consumed by hand needs none (the worker refuses it, saying so), and a task queue's is
    the package's own."""
    configs, _ = conf.parse(conf.raw_setting())  # check_delayqueues reports the rest
    errors: list[CheckMessage] = []
    for config in configs.values():
        if config.handler is None and not handlers.is_registered(config.name):
            continue  # a task queue, or one consumed by hand: nothing of the user's to find
        try:
            handlers.resolve(config)
        except handlers.HandlerNotFound as problem:
            errors.append(Error(problem.message, hint=problem.hint, id=problem.id))
    return errors


@register()
def check_history_redact(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Each queue's HISTORY_REDACT imports and is callable, as the worker will need it when
    a handler first fails (what its module raises on import is reported)."""
    configs, _ = conf.parse(conf.raw_setting())  # check_delayqueues reports the rest
    errors: list[CheckMessage] = []
    for config in configs.values():
        path = config.history_redact
        if path is None:
            continue
        try:
            redact = import_string(path)
        except Exception as error:
            problem = f"could not be imported: {type(error).__name__}: {error}"
        else:
            if callable(redact):
                continue
            problem = f"is a {type(redact).__name__}, not a callable"
        errors.append(
            Error(
                f"{SETTING}[{config.name!r}]['HISTORY_REDACT'] {path!r} {problem}.",
                hint="It is called as redact(message, error) before an attempt record is "
                "stored, and returns the exception to store.",
                id="delayqueue_django.E087",
            )
        )
    return errors


@register()
def check_loop_blocked_after(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    value = getattr(settings, LOOP_BLOCKED_AFTER_SETTING, DEFAULT_LOOP_BLOCKED_AFTER)
    problem = loop_blocked_after_problem(value)
    if problem is None:
        return []
    return [
        Error(
            f"{problem}.",
            hint=f"The default, {DEFAULT_LOOP_BLOCKED_AFTER:g}, reports an async handler that "
            "holds the worker's event loop for more than 100 ms.",
            id="delayqueue_django.E070",
        )
    ]


# The settings the package reads (each queue's options are in DELAYQUEUES), and how a
# setting's name starts that can only be meant for it.
PACKAGE_SETTINGS = (SETTING, OUTBOX_DATABASES_SETTING, "DELAYQUEUE_METRICS_TOKEN")
PACKAGE_PREFIX = folded("DELAYQUEUE")


@register()
def check_setting_names(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """A setting named like one of the package's but none of them (``DELAYQUEUE`` for
    ``DELAYQUEUES``) is read by nothing: the project runs on the defaults, or with no
    queue, and nothing else would say why. A warning: a project may have a setting of its
    own that starts so (silence W003 then)."""
    found: list[CheckMessage] = []
    for name in sorted(dir(settings)):
        if name in PACKAGE_SETTINGS or not name.isupper():
            continue
        guess = meant(name, PACKAGE_SETTINGS)
        if guess is None and not folded(name).startswith(PACKAGE_PREFIX):
            continue
        found.append(
            Warning(
                f"{name} is not a setting of delayqueue_django: nothing reads it.",
                hint=f"Did you mean {guess}?"
                if guess is not None
                else f"Its settings are {', '.join(PACKAGE_SETTINGS[:-1])} and "
                f"{PACKAGE_SETTINGS[-1]}; a queue's options go in {SETTING}[name].",
                id="delayqueue_django.W003",
            )
        )
    return found


# Shorter tokens can be guessed; the endpoint compares in constant time but cannot rate-limit.
MIN_METRICS_TOKEN_LENGTH = 16


@register()
def check_metrics_token(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    token = getattr(settings, "DELAYQUEUE_METRICS_TOKEN", None)
    if token is None or (isinstance(token, str) and len(token) >= MIN_METRICS_TOKEN_LENGTH):
        return []
    if isinstance(token, str):
        problem = f"is {len(token)} characters long; use at least {MIN_METRICS_TOKEN_LENGTH}"
    else:
        problem = f"must be a string, not {type(token).__name__}"
    return [
        Error(
            f"DELAYQUEUE_METRICS_TOKEN {problem}.",
            hint="Generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'",
            id="delayqueue_django.E015",
        )
    ]


@register()
def check_schedule_tasks(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """A task queue's messages are task calls, so its schedules must name a TASK; any other
    queue's handler gets PAYLOAD, so its schedules must not."""
    configs, _ = conf.parse(conf.raw_setting())
    task_queues = task_queue_names()
    errors: list[CheckMessage] = []
    for name, config in configs.items():
        for schedule in declared_schedules(config):
            where = f"DELAYQUEUES[{name!r}]['SCHEDULES'][{schedule.name!r}]"
            if name in task_queues and schedule.task is None:
                errors.append(
                    Error(
                        f"{where} has no TASK, but a DelayQueueBackend in TASKS carries queue "
                        f"{name!r}: its messages are run as tasks.",
                        hint="Name the task to run: TASK, with ARGS and KWARGS.",
                        id="delayqueue_django.E049",
                    )
                )
            elif name not in task_queues and schedule.task is not None:
                errors.append(
                    Error(
                        f"{where} names TASK {schedule.task!r}, but no DelayQueueBackend in "
                        f"TASKS carries queue {name!r}.",
                        hint="List the queue in a DelayQueueBackend's QUEUES, or send a "
                        "PAYLOAD to the queue's handler instead.",
                        id="delayqueue_django.E049",
                    )
                )
    return errors


@register(deploy=True)
def check_memory_queues_in_deployment(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """``check --deploy``: an in-memory queue in production loses its messages."""
    configs, _ = conf.parse(conf.raw_setting())
    return [
        Warning(
            f"DELAYQUEUES[{name!r}] keeps its messages in this process's memory "
            f"({config.url}): they are lost when the process ends, and no other process, "
            "no worker included, sees them.",
            hint="Give the queue a Redis URL or a REDIS cache alias; memory:// is for tests "
            "and quick local runs.",
            id="delayqueue_django.W002",
        )
        for name, config in configs.items()
        if config.memory_name is not None
    ]


@register()
def check_outbox_databases(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    value = getattr(settings, OUTBOX_DATABASES_SETTING, None)
    problem = None if value is None else outbox_databases_problem(value)
    if problem is None:
        return []
    return [Error(problem.msg, hint=problem.hint, id=problem.id)]


@register(Tags.database)
def check_outbox_tables(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    """``check --database ALIAS`` (and ``migrate``): the tables of the outbox and of the
    processed ids exist where queues using them write, i.e. the migration was applied
    (W030); and no outbox holds rows of a queue DELAYQUEUES no longer has (W031)."""
    from delayqueue_django.outbox.models import OutboxMessage, ProcessedMessage

    configs, problems = conf.parse(conf.raw_setting())
    if problems or not databases:
        return []
    outbox_aliases = _outbox_databases()
    needed: dict[str, set[str]] = {}
    if any(config.outbox for config in configs.values()):
        for alias in outbox_aliases:
            needed.setdefault(alias, set()).add(OutboxMessage._meta.db_table)
    for config in configs.values():
        if config.exactly_once is not None:
            needed.setdefault(config.exactly_once, set()).add(ProcessedMessage._meta.db_table)
    messages: list[CheckMessage] = []
    for alias in sorted((set(needed) | set(outbox_aliases)) & set(databases)):
        try:
            with connections[alias].cursor() as cursor:
                tables = set(connections[alias].introspection.table_names(cursor))
            if alias in outbox_aliases and OutboxMessage._meta.db_table in tables:
                messages += _stranded_rows(alias, configs)
        except DatabaseError:
            continue  # a database that cannot be reached is not this check's finding
        missing = sorted(needed.get(alias, set()) - tables)
        if missing and not _run_by_migrate():
            messages.append(
                Warning(
                    f"database {alias!r} has no table {', '.join(missing)}: a queue with "
                    "OUTBOX or EXACTLY_ONCE writes there, and would fail.",
                    hint=f"Apply delayqueue_django's migrations: python manage.py migrate "
                    f"delayqueue_django --database {alias}",
                    id="delayqueue_django.W030",
                )
            )
    return messages


def _run_by_migrate() -> bool:
    """Whether these checks run inside ``migrate`` (or a command built on it). Django runs
    the database checks before the migrations, so on a new database W030 would say, in
    the very command that creates them, that the tables are missing: a project's first
    ``migrate`` warned every time. ``check --database`` still reports them. Django tells a
    check nothing of the command that runs it, so the calling frames are looked at."""
    from django.core.management.commands.migrate import Command as MigrateCommand

    frame = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), MigrateCommand):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _outbox_databases() -> list[str]:
    try:
        return outbox_databases()
    except QueueConfigurationError:
        return []  # check_outbox_databases reports it


def _stranded_rows(alias: str, configs: Mapping[str, QueueConfig]) -> list[CheckMessage]:
    """W031: outbox rows of a queue no longer in DELAYQUEUES (renamed or removed with rows
    still waiting): no relay reads them, and no report counts them."""
    from delayqueue_django.outbox.models import OutboxMessage

    stranded = outbox_table.stranded(alias, configs)
    if not stranded:
        return []
    oldest = datetime.fromtimestamp(min(at for _, at in stranded.values()) / 1000, UTC)
    queues = ", ".join(f"{name!r} ({count})" for name, (count, _) in stranded.items())
    return [
        Warning(
            f"database {alias!r} holds outbox rows of queues not in DELAYQUEUES: {queues}, "
            f"the oldest written {oldest:%Y-%m-%d %H:%M:%S} UTC. No relay sends them.",
            hint="Configure those queues again (a relay then sends their rows), or delete the "
            f"rows: DELETE FROM {OutboxMessage._meta.db_table} WHERE queue = '...'.",
            id="delayqueue_django.W031",
        )
    ]
