"""Fixtures of the chaos scenarios: sizes, worker fleets, settings shared by the test process
and its workers, and the figures table."""

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from delayqueue_django import get_queue
from delayqueue_django.core.queue import Queue
from tests.chaos.figures import FIGURES, Figures
from tests.chaos.fleet import WorkerFleet

HANDLER = "tests.chaos.handlers.handle"
# The same, as an ``async def`` handler: run on each worker process's event loop.
ASYNC_HANDLER = "tests.chaos.handlers.ahandle"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Small runs (make test) run each outbox fault scenario on the database its
    ``chaos_database`` mark names (each of the three on one of them), or on SQLite where
    that server was not found; make chaos runs every scenario on every database."""
    if config.getoption("chaos_all_databases"):
        return
    kept: list[pytest.Item] = []
    deselected: list[pytest.Item] = []
    for item in items:
        mark = item.get_closest_marker("chaos_database")
        callspec = getattr(item, "callspec", None)
        if mark is None or callspec is None:
            kept.append(item)
            continue
        named = mark.args[0] if mark.args[0] in settings.DATABASES else "default"
        (kept if callspec.params["database"] == named else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


@pytest.fixture
def chaos_messages(request: pytest.FixtureRequest) -> int:
    return int(request.config.getoption("chaos_messages"))


@pytest.fixture
def chaos_rounds(request: pytest.FixtureRequest) -> int:
    return int(request.config.getoption("chaos_rounds"))


@pytest.fixture
def chaos_schedule_seconds(request: pytest.FixtureRequest) -> int:
    return int(request.config.getoption("chaos_schedule_seconds"))


@pytest.fixture
def report_figures(request: pytest.FixtureRequest) -> Callable[[Figures], None]:
    return request.config.stash[FIGURES].append


def queue_settings(url: str | None = None, *, redis: str | None = None, **options: Any) -> Any:
    """DELAYQUEUES for a chaos run: the default queue, on a URL or a cache alias."""
    queue: dict[str, Any] = {"HANDLER": HANDLER, "NACK_REDELIVERY_DELAY": 0, **options}
    if url is not None:
        queue["URL"] = url
    if redis is not None:
        queue["REDIS"] = redis
    return {"DELAYQUEUES": {"default": queue}}


@pytest.fixture
def use_settings(settings: Any) -> Callable[[dict[str, Any]], Queue]:
    """Apply chaos settings (as passed to the workers) in this process; returns the queue."""

    def apply(chaos_settings: dict[str, Any]) -> Queue:
        for name, value in chaos_settings.items():
            setattr(settings, name, value)
        return get_queue()

    return apply


@pytest.fixture
def fleets(tmp_path: Path) -> Iterator[Callable[..., WorkerFleet]]:
    """``fleets(chaos_settings, *worker_args, size=n, command=...)``: a fleet of worker (or
    relay) processes, closed after the test."""
    made: list[WorkerFleet] = []

    def make(
        chaos_settings: dict[str, Any],
        *worker_args: str,
        size: int = 2,
        command: str = "run_delayqueue",
    ) -> WorkerFleet:
        folder = tmp_path / f"fleet-{len(made)}"
        fleet = WorkerFleet(folder, chaos_settings, *worker_args, size=size, command=command)
        made.append(fleet)
        return fleet

    yield make
    for fleet in made:
        fleet.close()
