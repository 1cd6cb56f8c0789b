"""``run_delayqueue --processes N``: a supervisor process and N worker processes, each the
same command with its ``--concurrency`` handler threads (started as a fresh interpreter, so
that a replacement loads the code as it is on disk now).

- A child that dies is replaced, after a backoff that grows while children keep dying
  young; the log says why it died (exit status or signal).
- A child that exits before it was ready (bad settings, a handler that cannot be imported)
  ends the command with exit 1: what it printed says why, and a crash loop would not help.
- First stop request: every child stops gracefully (``--grace``); second: at once.
- SIGHUP (``request_reload``): the children are replaced one by one, each by a fresh one
  started first; the old one then stops gracefully (running handlers finish, buffered
  messages go back), so no delivery is dropped or run twice by the change.
- ``--max-messages`` (the child stops itself) and ``--max-memory`` (the supervisor asks it
  to, once its resident set passes the size) recycle a child: a fresh one takes its place.
  Children that keep passing the size soon after they start (a limit near a fresh
  process's size) are replaced with the crash loop's growing backoff, and a warning says so.
- A child that did not stop cleanly (killed for TIME_LIMIT, crashed) left its heartbeat
  behind: the supervisor removes it at once, so that the admin and delayqueue_stats do not
  list a dead process, running its handler, until the heartbeat expires.
- TIME_LIMIT with ``--concurrency 1``: a child whose handler runs past it is killed, and the
  delivery refused (time_limits).

The supervisor's side of one child is child_process; link is the socket between them (what
a child reports of the messages it holds).
"""

import contextlib
import logging
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Sequence
from secrets import token_hex
from typing import Any

from delayqueue_django.core.queue import Queue
from delayqueue_django.worker import heartbeat, memory, time_limits
from delayqueue_django.worker.supervisor.child_process import ChildProcess, describe_exit

logger = logging.getLogger("delayqueue_django.worker")

# How often the supervisor looks at its children while they need watching closely (stopping,
# a reload under way, TIME_LIMIT to enforce)...
TICK_SECONDS = 0.05
# ...and at rest: each look polls every child, and looking each TICK_SECONDS was most of an
# idle command's CPU. A stop or reload request, a child that exits or says it is ready, wakes
# it at once; the heartbeat, --max-memory's checks and a replacement's start keep their times.
REST_LOOK_SECONDS = 1.0
# Restart backoff: doubled for each child that dies young, back to the first once one has
# lived LIVED_LONG_SECONDS.
FIRST_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 30.0
LIVED_LONG_SECONDS = 30.0
MEMORY_CHECK_SECONDS = 1.0
# After the grace, how long children get to leave before they are killed.
EXIT_MARGIN_SECONDS = 10.0


class ChildCannotStart(Exception):
    """A worker process exited before it was ready to fetch."""


class Supervisor:
    def __init__(
        self,
        *,
        processes: int,
        argv: Sequence[str],
        env: dict[str, str],
        queues: list[Queue],
        grace: float,
        burst: bool = False,
        max_memory_mb: float | None = None,
        heartbeat_interval: float = 10.0,
        time_limits: dict[str, float] | None = None,
    ) -> None:
        self.processes = processes
        self.argv = list(argv)
        self.env = env
        self.queues = queues
        self.grace = grace
        self.burst = burst
        self.max_memory_mb = max_memory_mb
        self.heartbeat_interval = heartbeat_interval
        # Enforced by killing the child: only where it runs one handler at a time.
        self.time_limits = time_limits or {}
        self.supervisor_id = f"{socket.gethostname()}:{os.getpid()}:{token_hex(3)}"
        self.started_at = time.time()
        self.children: list[ChildProcess] = []
        self.restarts = 0
        self._starts_due: list[float] = []  # when to start each replacement (monotonic)
        self._backoff = FIRST_BACKOFF_SECONDS
        self._stop_requests = 0
        self._reload_requested = threading.Event()
        self._rollout: list[ChildProcess] = []  # children still to replace after a SIGHUP
        self._rollout_new: ChildProcess | None = None
        # Children that exited with an error while the command was stopping.
        self.failed_exits = 0
        # Whether a second stop request had the children leave at once.
        self.left_at_once = False
        # --max-memory's backoff (as the restarts'): no replacement for size before
        # _recycle_not_before (monotonic) while children pass the size young.
        self._recycle_backoff = FIRST_BACKOFF_SECONDS
        self._recycle_not_before = 0.0
        self._told_recycle_backoff = False
        # --burst: the worst exit status of the children, each done once.
        self._burst_status = 0
        # Why the command ends with an error: a child could not start.
        self._cannot_start: str | None = None
        # What wakes the loop between looks (see _wake): written from signal handlers and the
        # children's reader threads, so a socket, not a lock.
        self._woken, self._waker = socket.socketpair()
        self._woken.setblocking(False)
        self._waker.setblocking(False)

    # Requests, from signal handlers: they only set flags the loop reads.

    @property
    def stop_requested(self) -> bool:
        return self._stop_requests > 0

    def request_stop(self) -> None:
        self._stop_requests += 1
        self._wake()

    def request_reload(self) -> None:
        self._reload_requested.set()
        self._wake()

    def _wake(self) -> None:
        """End the loop's wait now. Safe in a signal handler (no lock), from any thread; a
        full socket already holds a wake-up."""
        with contextlib.suppress(OSError):
            self._waker.send(b"\0")

    def _wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``, or until woken."""
        select.select([self._woken], [], [], max(seconds, 0.0))
        with contextlib.suppress(OSError):
            while self._woken.recv(4096):
                pass

    def _at_rest(self, stopping: bool) -> bool:
        """Whether nothing but a wake-up or a timed duty can call for a look: no stop, no
        reload under way, no TIME_LIMIT to enforce (each child's handlers are looked at)."""
        return not (
            stopping
            or self.time_limits
            or self._rollout
            or self._rollout_new is not None
            or self._reload_requested.is_set()
        )

    # The loop

    def run(self) -> int:
        """Run until stopped; returns the command's exit status. Raises ChildCannotStart
        (once the other children stopped)."""
        logger.info(
            "supervisor %s: starting %d worker processes", self.supervisor_id, self.processes
        )
        for _ in range(self.processes):
            self._start()
        next_beat = next_memory_check = 0.0
        stopping_since: float | None = None
        try:
            while True:
                now = time.monotonic()
                if self._reap(stopping=stopping_since is not None):
                    next_beat = now  # the heartbeat lists the children: tell it now
                if (self._stop_requests or self._cannot_start) and stopping_since is None:
                    stopping_since = now
                    self._stop_all()
                if self._stop_requests > 1 and not self.left_at_once:
                    self.left_at_once = True
                    self._stop_all_now()
                if stopping_since is not None:
                    if not self.children:
                        if self._cannot_start is not None:
                            raise ChildCannotStart(self._cannot_start)
                        return 1 if self.left_at_once or self.failed_exits else 0
                    if now - stopping_since > self.grace + EXIT_MARGIN_SECONDS:
                        for child in self.children:
                            child.kill("did not stop after the grace")
                elif self.burst and not self.children:
                    return self._burst_status
                else:
                    self._start_due(now)
                    self._enforce_time_limits(now)
                    if self.max_memory_mb is not None and now >= next_memory_check:
                        next_memory_check = now + MEMORY_CHECK_SECONDS
                        self._recycle_big_children(now)
                    self._roll_out()
                if now >= next_beat:
                    next_beat = now + self.heartbeat_interval
                    self._beat()
                if not self._at_rest(stopping_since is not None):
                    self._wait(TICK_SECONDS)
                    continue
                timed = [next_beat, *self._starts_due, now + REST_LOOK_SECONDS]
                if self.max_memory_mb is not None:
                    timed.append(next_memory_check)
                self._wait(min(timed) - time.monotonic())
        finally:
            for child in self.children:
                child.kill("the supervisor is leaving")
                if child.worker_id is not None:
                    self._forget(child.worker_id)
            self._forget(self.supervisor_id)
            self._woken.close()
            self._waker.close()

    def _start(self) -> ChildProcess:
        child = ChildProcess(
            self.argv, self.env, report_messages=bool(self.time_limits), on_news=self._wake
        )
        self.children.append(child)
        return child

    def _start_due(self, now: float) -> None:
        due = [at for at in self._starts_due if at <= now]
        if due:
            self._starts_due = [at for at in self._starts_due if at > now]
            for _ in due:
                self._start()

    def _reap(self, *, stopping: bool) -> bool:
        """Take in the children that exited; whether there were any."""
        reaped = False
        for child in list(self.children):
            code = child.poll()
            if code is None:
                continue
            reaped = True
            self.children.remove(child)
            child.close()
            if code != 0 and child.worker_id is not None:
                # A clean stop removes its own heartbeat; this one's would stay listed,
                # running its handler, until it expired.
                self._forget(child.worker_id)
            self._exited(child, code, stopping=stopping)
        return reaped

    def _exited(self, child: ChildProcess, code: int, *, stopping: bool) -> None:
        how = describe_exit(code)
        if not child.ready.is_set() and child.stop_reason is None and not stopping:
            if child is self._rollout_new:
                logger.error(
                    "reload: the new worker process pid %d could not start (%s); the old "
                    "ones go on",
                    child.pid,
                    how,
                )
                self._rollout, self._rollout_new = [], None
                return
            if self._cannot_start is None:
                self._cannot_start = (
                    f"worker process pid {child.pid} could not start ({how}); its error is "
                    "above. Stopping rather than starting it again."
                )
            return
        if stopping:
            # One stopped before it was ready had taken nothing: it says "ready" once its
            # signal handlers are in place, before its first fetch, so a SIGTERM before
            # then ended it as Python's default action does, and that is a clean stop.
            # After a second stop request, leaving with an error is what it was told to do.
            clean = code == 0 or (code == -signal.SIGTERM and not child.ready.is_set())
            if not clean and not self.left_at_once:
                self.failed_exits += 1
                logger.warning("worker process pid %d stopped: %s", child.pid, how)
            return
        if child.stop_reason is not None:
            # Its replacement is started already.
            logger.info("worker process pid %d stopped (%s): %s", child.pid, child.stop_reason, how)
            return
        if self._rollout and child is self._rollout[0] and self._rollout_new is not None:
            # Died while its replacement starts: that one takes its place.
            logger.warning("worker process pid %d died (%s) while being replaced", child.pid, how)
            return
        if self.burst:
            # Done with everything due (0), or gave up on Redis (3) or failed: not run again
            # either way. The command exits with the worst status of its processes.
            self._burst_status = max(self._burst_status, code if code >= 0 else 1)
            logger.info("worker process pid %d is done: %s", child.pid, how)
            return
        if code == 0:
            # It stopped itself, as --max-messages has it do, or someone sent it SIGTERM.
            logger.info("worker process pid %d finished its run; starting another", child.pid)
            self._start()
            return
        lived = time.monotonic() - child.started_at
        if lived >= LIVED_LONG_SECONDS:
            self._backoff = FIRST_BACKOFF_SECONDS
        self.restarts += 1
        logger.warning(
            "worker process pid %d died (%s) after %.1f s; starting another in %.1f s (restart %d)",
            child.pid,
            how,
            lived,
            self._backoff,
            self.restarts,
        )
        self._starts_due.append(time.monotonic() + self._backoff)
        self._backoff = min(self._backoff * 2, MAX_BACKOFF_SECONDS)

    def _stop_all(self) -> None:
        self._starts_due = []
        self._rollout, self._rollout_new = [], None
        for child in self.children:
            child.stop("stop requested")

    def _stop_all_now(self) -> None:
        for child in self.children:
            child.stop_now()

    def closing_line(self) -> str:
        """What the command says once the supervisor is done (every child gone)."""
        if self.left_at_once:
            how = (
                "stopped at once (a second stop request): running handlers were cut short, "
                "and their messages are delivered again once their lease ends "
                "(MAX_CONSUME_DURATION)"
            )
        elif self.failed_exits:
            how = f"stopped: {_processes(self.failed_exits)} did not stop cleanly"
        elif self.stop_requested:
            how = "stopped: every worker process finished its running handlers"
        elif self._burst_status:
            how = f"done: a worker process ended with exit status {self._burst_status}"
        else:
            how = "done: every worker process finished its burst"
        restarts = f" ({self.restarts} restart{'s' if self.restarts != 1 else ''})"
        return f"Supervisor {self.supervisor_id} {how}{restarts if self.restarts else ''}."

    # Recycling

    def _replace(self, child: ChildProcess, reason: str) -> None:
        """Start a fresh child, then stop ``child`` gracefully."""
        self._start()
        child.stop(reason)

    def _recycle_big_children(self, now: float) -> None:
        limit = self.max_memory_mb
        assert limit is not None
        backing_off = now < self._recycle_not_before
        youngest: float | None = None
        for child in list(self.children):
            if child.stop_reason is not None or not child.ready.is_set():
                continue
            size = memory.resident_mb(child.pid)
            if size is None or size <= limit:
                continue
            if child.over_memory_since is None:
                child.over_memory_since = now
            # How young it passed the size (a backoff that keeps it longer changes nothing).
            young_at = child.over_memory_since - child.started_at
            if backing_off:
                self._say_recycling_backs_off(child, size, young_at)
                continue
            logger.info(
                "worker process pid %d holds %.0f MB, over --max-memory %g: replacing it",
                child.pid,
                size,
                limit,
            )
            self._replace(child, "--max-memory")
            youngest = young_at if youngest is None else min(youngest, young_at)
        if youngest is None:
            return
        # As for children that die young: a replacement that passes the size young as well
        # (a limit near what a fresh process holds) would be replaced again at once, for
        # ever. The next waits, longer each time, until one lived long under it.
        if youngest >= LIVED_LONG_SECONDS:
            self._recycle_backoff = FIRST_BACKOFF_SECONDS
        else:
            self._recycle_not_before = now + self._recycle_backoff
            self._recycle_backoff = min(self._recycle_backoff * 2, MAX_BACKOFF_SECONDS)

    def _say_recycling_backs_off(self, child: ChildProcess, size: float, young_at: float) -> None:
        if self._told_recycle_backoff:
            return
        self._told_recycle_backoff = True
        logger.warning(
            "worker process pid %d passed --max-memory %g %.0f s after its start (%.0f MB), "
            "as the one before it did: replacing processes for their size backs off (up to "
            "%g s apart) while they pass it young. If a fresh process holds about that "
            "much, raise --max-memory",
            child.pid,
            self.max_memory_mb,
            young_at,
            size,
            MAX_BACKOFF_SECONDS,
        )

    def _roll_out(self) -> None:
        """SIGHUP: one child at a time, a fresh one started and ready before the old stops."""
        if self._reload_requested.is_set():
            self._reload_requested.clear()
            if self._rollout or self._rollout_new is not None:
                logger.info("SIGHUP received during a reload: replacing every process again")
            else:
                logger.info("SIGHUP received: replacing the worker processes one by one")
            self._rollout = [c for c in self.children if c.stop_reason is None]
            self._rollout_new = None
        new = self._rollout_new
        if new is not None:
            if not new.ready.is_set():
                return
            old = self._rollout.pop(0)
            if old in self.children:
                old.stop("reload")
            self._rollout_new = None
        while self._rollout and self._rollout[0] not in self.children:
            self._rollout.pop(0)  # died meanwhile: replaced already
        if self._rollout:
            self._rollout_new = self._start()
        elif new is not None:
            logger.info("reload done: every worker process runs the code loaded afresh")

    # TIME_LIMIT

    def _enforce_time_limits(self, now: float) -> None:
        for child in list(self.children):
            if child.stop_reason is not None:
                continue
            for message, started in child.running():
                limit = self.time_limits.get(message.queue)
                if limit is not None and now - started > limit:
                    self._stop_over_time(child, message, limit, now - started)
                    break

    def _stop_over_time(self, child: ChildProcess, message: Any, limit: float, ran: float) -> None:
        child.kill("time limit")
        logger.warning(
            "message id=%s queue=%s attempt=%s ran past its TIME_LIMIT of %g s: worker "
            "process pid %d killed, the delivery counts as a failed attempt",
            message.id,
            message.queue,
            message.attempt,
            limit,
            child.pid,
        )
        child.process.wait()
        self._start()
        time_limits.refuse_over_time(message, limit, ran)
        time_limits.hand_back(child.buffered())

    # Heartbeats

    def details(self) -> dict[str, Any]:
        return {
            "role": "supervisor",
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": [queue.name for queue in self.queues],
            "processes": self.processes,
            "children": [child.pid for child in self.children],
            "restarts": self.restarts,
            "started": self.started_at,
            "last_seen": time.time(),
            "running": [],
        }

    def _beat(self) -> None:
        details = self.details()
        for queue in self.queues:
            try:
                heartbeat.beat(queue, self.supervisor_id, details, self.heartbeat_interval * 3)
            except Exception as error:  # a heartbeat is best effort: the loop goes on
                logger.debug("supervisor heartbeat on queue=%s failed: %s", queue.name, error)

    def _forget(self, worker_id: str) -> None:
        """Remove the heartbeat of this supervisor or of one of its children."""
        for queue in self.queues:
            try:
                heartbeat.forget(queue, worker_id)
            except Exception as error:  # best effort: it expires on its own
                logger.debug(
                    "heartbeat removal id=%s queue=%s failed: %s", worker_id, queue.name, error
                )


def _processes(count: int) -> str:
    return f"{count} worker process{'es' if count != 1 else ''}"
