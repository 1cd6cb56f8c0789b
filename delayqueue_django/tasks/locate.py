"""Finding the task a message names, without letting a message run anything else.

A worker imports only what is already imported or lives inside an installed app, and runs
only an object that really is a ``Task``: write access to Redis must not be a way to call
arbitrary functions or to import arbitrary modules (imports run code).
"""

from __future__ import annotations

import sys
from typing import Any

from django.apps import apps
from django.utils.module_loading import import_string

from delayqueue_django.tasks.call import MalformedTaskMessage, TaskCall
from delayqueue_django.tasks.compat import InvalidTask, Task


class UnknownTask(LookupError):
    """The path in a message does not lead to a task this process may run."""


# Why a message is not a task this process may run.
NOT_A_TASK = (MalformedTaskMessage, UnknownTask, InvalidTask)


def locate_task(path: str) -> Task[..., Any]:
    module = path.rpartition(".")[0]
    if module not in sys.modules and apps.get_containing_app_config(module) is None:
        raise UnknownTask(
            f"{path!r} is outside every installed app; only tasks defined in INSTALLED_APPS "
            "(or already imported) are run"
        )
    try:
        found = import_string(path)
    except ImportError as error:
        raise UnknownTask(f"{path!r} cannot be imported: {error}") from None
    except (Exception, SystemExit) as error:
        # Importing runs the module's code, which may raise anything (a setting missing in
        # this environment, a sys.exit()): a task that cannot be had all the same. The
        # cause stays attached, for the worker to log where the import failed.
        raise UnknownTask(
            f"{path!r} cannot be imported: {type(error).__name__}: {error}"
        ) from error
    if not isinstance(found, Task):
        raise UnknownTask(f"{path!r} is a {type(found).__name__}, not a task; refusing to run it")
    if found.module_path != path:
        raise UnknownTask(f"{path!r} refers to the task {found.module_path!r} under another name")
    return found


def declared_task(path: str) -> Task[..., Any] | None:
    """The task as its module declares it, if that module is imported and already holds it
    (not while the ``@task`` decorator is still creating it). Imports nothing."""
    module, _, name = path.rpartition(".")
    found = getattr(sys.modules.get(module), name, None)
    return found if isinstance(found, Task) else None


def enqueued_task(call: TaskCall) -> Task[..., Any]:
    """The task as it was enqueued: the declared task with the backend, queue and
    ``run_after`` of the call, validated by that backend (raises ``InvalidTask``)."""
    # using() creates a new Task, which the framework validates with the Task's backend.
    return locate_task(call.task_path).using(
        backend=call.backend, queue_name=call.queue_name, run_after=call.run_after_time
    )
