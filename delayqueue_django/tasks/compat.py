"""The task framework: ``django.tasks`` (Django 6.0+) or the ``django-tasks`` backport.

Both offer the same classes; the backport's releases up to 0.12 name the invalid-task error
``InvalidTaskError``, its newer ones ``InvalidTask`` as Django does. Types are checked
against ``django.tasks``.
"""

from types import ModuleType
from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

INVALID_TASK_NAMES = ("InvalidTask", "InvalidTaskError")


def invalid_task_error(exceptions: ModuleType) -> type[Exception]:
    """The framework's invalid-task error, under whichever name its ``exceptions`` module
    gives it."""
    for name in INVALID_TASK_NAMES:
        error = getattr(exceptions, name, None)
        if isinstance(error, type) and issubclass(error, Exception):
            return error
    raise ImproperlyConfigured(
        f"{exceptions.__name__} has neither {' nor '.join(INVALID_TASK_NAMES)}: "
        "a django-tasks release this package does not know"
    )


if TYPE_CHECKING:
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
else:
    try:
        from django.tasks import (
            Task,
            TaskContext,
            TaskResult,
            TaskResultStatus,
            task,
            task_backends,
        )
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import TaskError
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started
        from django.utils.json import normalize_json
    except ImportError:
        try:
            from django_tasks import TaskContext, TaskResult, TaskResultStatus, task, task_backends
            from django_tasks import exceptions as _backport_exceptions
            from django_tasks import signals as _connect_setting_receivers  # noqa: F401
            from django_tasks.backends.base import BaseTaskBackend
            from django_tasks.base import Task, TaskError
            from django_tasks.exceptions import TaskResultDoesNotExist
            from django_tasks.signals import task_enqueued, task_finished, task_started
            from django_tasks.utils import normalize_json
        except ImportError:
            raise ImproperlyConfigured(
                "delayqueue_django.tasks needs Django's task framework: Django 6.0 or newer, "
                "or on Django 5.2 the backport (pip install 'delayqueue-django[tasks]', then "
                "add 'django_tasks' to INSTALLED_APPS)"
            ) from None
        InvalidTask = invalid_task_error(_backport_exceptions)

__all__ = [
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
