"""What the package's commands do differently as a process of their own (``manage.py``) than
inside a running one (``call_command``): refuse a memory queue, whose messages live in the
memory of the process that sends them; and end on Ctrl-C with one line instead of a
traceback."""

import logging
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from django.core.management.base import BaseCommand, CommandError

from delayqueue_django.core.queue import Queue

# The package logger's level for each --verbosity.
VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}
# The exit status of a command that Ctrl-C ended: 128 + SIGINT, as a shell reports a
# process that the signal killed, so that a script sees it was interrupted.
INTERRUPTED = 130


class OwnProcessCommand(BaseCommand):
    """A command that knows whether it runs as a process of its own (``manage.py``), rather
    than by ``call_command`` inside a running one."""

    own_process = False

    def run_from_argv(self, argv: list[str]) -> None:
        self.own_process = True
        try:
            super().run_from_argv(argv)
        except KeyboardInterrupt:
            # Ctrl-C at a terminal: a traceback would only say where the command happened to
            # wait. (Through call_command it goes on to the caller, whose Ctrl-C it is.)
            # Where SIGINT is a command's own graceful stop (a worker, a relay, --watch), it
            # comes here only when it falls outside that stop.
            self.stderr.write(f"{argv[1]}: interrupted")
            sys.exit(INTERRUPTED)

    def stop_signals(self) -> tuple[signal.Signals, ...]:
        """The signals this command takes for its graceful stop: SIGTERM always (a
        supervisor's), Ctrl-C's SIGINT only in a process of its own. Through call_command,
        Ctrl-C is the caller's, as a KeyboardInterrupt: taken by the command, a test run's
        first Ctrl-C only stopped the worker it was running and the tests went on, and a
        second raised SystemExit in the test, which pytest reports as a failure and goes
        on after."""
        return (signal.SIGTERM, signal.SIGINT) if self.own_process else (signal.SIGTERM,)

    def refuse_memory_queues(self, queues: Sequence[Queue], *, instead: str) -> None:
        """In a process of its own, say that a memory queue cannot be seen, and what to do
        ``instead``, rather than show or wait for messages that never come."""
        if not self.own_process:
            return
        for queue in queues:
            if queue.config.memory_name is not None:
                raise CommandError(
                    f"queue {queue.name!r} keeps its messages in the memory of the process "
                    f"that sends them ({queue.config.url}); a process of its own would never "
                    f"see them. {instead}"
                )

    @contextmanager
    def package_log(self, verbosity: int) -> Iterator[None]:
        """Show the package's log at the level ``verbosity`` asks for: through the handlers
        the project's LOGGING gives it, else on this command's stdout."""
        package = logging.getLogger("delayqueue_django")
        previous_level = package.level
        package.setLevel(VERBOSITY_LEVELS.get(verbosity, logging.DEBUG))
        added = None
        if not self._logged_by_the_project(package):
            added = logging.StreamHandler(self.stdout)
            added.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            package.addHandler(added)
        try:
            yield
        finally:
            package.setLevel(previous_level)
            if added is not None:
                package.removeHandler(added)

    def _logged_by_the_project(self, package: logging.Logger) -> bool:
        """Whether the package's records reach a handler already. In a process of its own,
        any handler up the loggers' tree is the project's LOGGING (a root console handler,
        say): a handler of the command's besides would print every line twice. Through
        call_command, the process's handlers are the caller's (a test run's capture, an
        app's): the command prints on the stdout it was given unless the package itself
        has a handler."""
        return package.hasHandlers() if self.own_process else bool(package.handlers)
