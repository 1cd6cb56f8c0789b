"""The signals of ``run_delayqueue --processes``: the supervisor's (a stop, passed on to
its worker processes; SIGHUP, a rollout) and its worker processes' (see child_signals)."""

import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from delayqueue_django.worker import Worker
from delayqueue_django.worker.supervisor import Supervisor
from delayqueue_django.worker.supervisor.child_process import IMMEDIATE_STOP

logger = logging.getLogger("delayqueue_django.worker")


@contextmanager
def supervisor_signals(
    supervisor: Supervisor, stop_signals: tuple[signal.Signals, ...]
) -> Iterator[None]:
    """The supervisor: each of ``stop_signals`` is a stop request (the second one the
    immediate stop), SIGHUP a rollout of fresh worker processes."""

    def on_stop(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if supervisor.stop_requested:
            logger.warning("%s received again: worker processes leave now", name)
        else:
            logger.info(
                "%s received: worker processes finish their running handlers (a second "
                "signal stops them at once)",
                name,
            )
        supervisor.request_stop()

    def on_reload(signum: int, frame: FrameType | None) -> None:
        supervisor.request_reload()

    wanted = {sig: on_stop for sig in stop_signals}
    wanted[signal.SIGHUP] = on_reload
    try:
        previous = {sig: signal.signal(sig, handler) for sig, handler in wanted.items()}
    except ValueError:  # not the main thread (--reload): the reloader stops it
        previous = {}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def child_signals(worker: Worker) -> Iterator[None]:
    """A worker process of a supervisor: SIGTERM only ever stops it gracefully (the
    service manager may send it to every process of the group, then the supervisor
    passes it on too), IMMEDIATE_STOP is the supervisor's second request; SIGINT and
    SIGHUP are the supervisor's to act on (a terminal sends them to the whole group)."""

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop_gracefully(worker)

    def on_immediate(signum: int, frame: FrameType | None) -> None:
        stop_gracefully(worker)
        worker.request_stop()
        raise SystemExit(1)

    wanted: dict[int, Any] = {
        signal.SIGTERM: on_term,
        IMMEDIATE_STOP: on_immediate,
        signal.SIGINT: signal.SIG_IGN,
        signal.SIGHUP: signal.SIG_IGN,
    }
    previous = {sig: signal.signal(sig, handler) for sig, handler in wanted.items()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_gracefully(worker: Worker) -> None:
    """The first stop request, never the second: a repeat changes nothing."""
    if not worker.stop_requested.is_set():
        logger.info("asked to stop: finishing running handlers")
        worker.request_stop()
