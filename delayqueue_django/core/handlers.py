"""Finding a queue's handler: the HANDLER setting, or a function registered with @handler.

The system check (``checks.check_handlers``) and the worker find a handler with the same
code, so ``manage.py check`` reports with the same words what would stop the worker.
"""

import difflib
import inspect
import pkgutil
from collections.abc import Callable
from importlib import import_module
from types import ModuleType
from typing import Any

from asgiref.sync import iscoroutinefunction

from delayqueue_django.core import features
from delayqueue_django.core.conf.queue_config import QueueConfig
from delayqueue_django.core.message import Message

Handler = Callable[[Message], Any]

_registered: dict[str, Handler] = {}


def handler(queue: str = "default") -> Callable[[Handler], Handler]:
    """Register the decorated function as ``queue``'s handler.

    The module must be imported when Django starts (e.g. from ``AppConfig.ready``); the
    queue's HANDLER setting, when given, takes precedence.
    """

    def register(function: Handler) -> Handler:
        _registered[queue] = function
        return function

    return register


def is_async(handler: Handler) -> bool:
    """Whether the handler is ``async def`` (or an object whose ``__call__`` is, or a
    function marked with ``markcoroutinefunction``): the worker awaits it on its event
    loop."""
    return iscoroutinefunction(handler) or iscoroutinefunction(type(handler).__call__)


def loop_router(handler: Handler) -> Callable[[Message], Handler | None] | None:
    """A handler that runs some messages on the event loop, chosen per message (the Tasks
    runner: an ``async def`` task there, a sync one in a thread), has a ``loop_handler``:
    given a message, the async handler to await for it, or None to run the handler itself
    in a thread. None for any other handler."""
    route = getattr(handler, "loop_handler", None)
    return route if callable(route) else None


def is_registered(queue: str) -> bool:
    return queue in _registered


class HandlerNotFound(LookupError):
    """A queue has no usable handler. ``id`` is the system check's, when one reports it;
    ``__cause__`` is what the handler's module raised, when importing it failed."""

    def __init__(self, message: str, *, hint: str | None = None, id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.id = id

    def __str__(self) -> str:
        return self.message if self.hint is None else f"{self.message}\nHINT: {self.hint}"


def resolve(config: QueueConfig) -> Handler:
    """HANDLER if set, else the @handler function, else the task runner on a task queue."""
    found = _find(config)
    if config.exactly_once and is_async(found):
        name = f"{getattr(found, '__module__', '?')}.{getattr(found, '__qualname__', found)}"
        raise HandlerNotFound(
            f"queue {config.name!r} is EXACTLY_ONCE, and its handler {name} is async def: "
            "EXACTLY_ONCE runs the handler and the record of the message as processed in one "
            "database transaction, and Django's transactions do not work in async code.",
            hint="Make the handler a sync def (it runs in a handler thread), or drop "
            "EXACTLY_ONCE and make the handler's effects idempotent.",
            id="delayqueue_django.E029",
        )
    return found


def _find(config: QueueConfig) -> Handler:
    if config.handler is not None:
        return import_handler(config.name, config.handler)
    if config.name in _registered:
        decorated = _registered[config.name]
        name = getattr(decorated, "__name__", "handle")
        where = (
            f"the @delayqueue_django.handler({config.name!r}) function "
            f"{getattr(decorated, '__module__', '?')}.{getattr(decorated, '__qualname__', name)}"
        )
        _check_signature(decorated, where, name)
        return decorated
    task_runner = _task_runner(config)
    if task_runner is not None:
        return task_runner
    # A decorator naming another queue (a typo, say) is the likely reason: name them.
    others = sorted(set(_registered) - {config.name})
    registered = f" (@handler registered functions for {', '.join(map(repr, others))})"
    raise HandlerNotFound(
        f"queue {config.name!r} has no handler: set DELAYQUEUES[{config.name!r}]['HANDLER'] "
        f"or decorate a function with @delayqueue_django.handler({config.name!r})"
        + (registered if others else "")
    )


def _task_runner(config: QueueConfig) -> Handler | None:
    """The Tasks wing's runner, on a queue that carries tasks (see core.features)."""
    tasks = features.tasks()
    return None if tasks is None else tasks.handler_for(config.name)


def import_handler(queue: str, path: str) -> Handler:
    """The callable at dotted ``path``; HandlerNotFound saying what is wrong and what to type.

    Importing runs the module's code: whatever it raises (a typo, a missing dependency)
    is reported as the handler's problem, never raised as it is.
    """
    where = f"DELAYQUEUES[{queue!r}]['HANDLER'] is {path!r}"
    module_path, _, name = path.rpartition(".")
    try:
        module = import_module(module_path)
    except ModuleNotFoundError as error:
        missing = error.name or module_path
        if module_path == missing or module_path.startswith(f"{missing}."):
            raise HandlerNotFound(
                f"{where}, but there is no module {missing!r}.",
                hint=_missing_module_hint(missing, module_path, name),
                id="delayqueue_django.E020",
            ) from None
        raise _import_failed(where, module_path, error) from error
    except (Exception, SystemExit) as error:  # a module calling sys.exit() stops nothing
        raise _import_failed(where, module_path, error) from error
    try:
        found = getattr(module, name)
    except AttributeError:
        raise HandlerNotFound(
            f"{where}, but module {module_path!r} has no attribute {name!r}.",
            hint=_did_you_mean(module_path, _close_match(name, _callables_in(module)), "")
            or f"Define it in {module.__file__ or module_path}: def {name}(message): ...",
            id="delayqueue_django.E020",
        ) from None
    if not callable(found):
        raise HandlerNotFound(
            f"{where}, which is not callable (of type {type(found).__name__}).",
            hint=f"Point HANDLER at a function taking the message: def {name}(message): ...",
            id="delayqueue_django.E021",
        )
    _check_signature(found, f"{where}, which", name)
    return found  # type: ignore[no-any-return]


def _check_signature(handler: Callable[..., Any], where: str, name: str) -> None:
    """The worker calls a handler with the message alone: one that cannot take it (no
    parameter, or a second one required) would fail every delivery until it is buried."""
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):  # some callables (builtins, C types) have none to read
        return
    try:
        signature.bind(None)
    except TypeError as error:
        raise HandlerNotFound(
            f"{where} cannot be called with the message alone ({error}).",
            hint=f"A handler takes one argument, the message: def {name}(message): ...",
            id="delayqueue_django.E022",
        ) from None


def _import_failed(where: str, module_path: str, error: BaseException) -> HandlerNotFound:
    return HandlerNotFound(
        f"{where}, but importing {module_path!r} raised {type(error).__name__}: {error}",
        hint=f'Fix that module; python manage.py shell -c "import {module_path}" '
        "shows the traceback.",
        id="delayqueue_django.E020",
    )


def _missing_module_hint(missing: str, module_path: str, name: str) -> str:
    parent_path, _, last = missing.rpartition(".")
    if parent_path:
        # The package exists (else it would be the missing one): maybe a typo in the rest.
        try:
            parent = import_module(parent_path)
            siblings = [info.name for info in pkgutil.iter_modules(getattr(parent, "__path__", []))]
        except Exception:
            siblings = []
        rest = f"{module_path.removeprefix(missing)}.{name}"
        hint = _did_you_mean(parent_path, _close_match(last, siblings), rest)
        if hint is not None:
            return hint
    return (
        f"Check the spelling, or create {module_path.replace('.', '/')}.py holding "
        f"the handler: def {name}(message): ..."
    )


def _callables_in(module: ModuleType) -> list[str]:
    return [
        attribute
        for attribute, value in vars(module).items()
        if callable(value) and not attribute.startswith("_")
    ]


def _close_match(name: str, candidates: list[str]) -> str | None:
    guesses = difflib.get_close_matches(name, candidates, n=1)
    return guesses[0] if guesses else None


def _did_you_mean(before: str, guess: str | None, after: str) -> str | None:
    return None if guess is None else f"Did you mean '{before}.{guess}{after}'?"
