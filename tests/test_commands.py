"""What every management command of the package does alike as a process of its own."""

import importlib
import os
import pkgutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from delayqueue_django.management import commands
from delayqueue_django.management.own_process import INTERRUPTED, OwnProcessCommand

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def silent_server() -> Iterator[socket.socket]:
    """A TCP port that takes connections and never answers, as a Redis stuck in a long
    command would not: a command asking it anything waits until its socket timeout."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(20)
    yield listener
    listener.close()


@pytest.fixture
def ctrl_c_reaches_commands() -> Iterator[None]:
    """SIGINT handled in this process while the test runs, so that the commands it starts
    begin with SIGINT's default action, as under a terminal. A suite started where SIGINT is
    ignored (``nohup make test &``, a script's background job) would pass that on, and the
    command would never see the Ctrl-C the test sends."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_every_command_shares_the_handling_of_a_process_of_its_own() -> None:
    names = [module.name for module in pkgutil.iter_modules(commands.__path__)]
    assert names, "no command found"
    for name in names:
        module = importlib.import_module(f"{commands.__name__}.{name}")
        assert issubclass(module.Command, OwnProcessCommand), name


@pytest.mark.parametrize(
    ("command", "env"),
    [
        (["delayqueue_stats"], {}),
        (["delayqueue_check"], {}),
        (["delayqueue_shards", "default"], {"DQ_TEST_SHARDS": "2"}),
    ],
    ids=["stats", "check", "shards"],
)
@pytest.mark.usefixtures("ctrl_c_reaches_commands")
def test_ctrl_c_while_waiting_for_redis_ends_with_one_line_and_status_130(
    silent_server: socket.socket, command: list[str], env: dict[str, str]
) -> None:
    port = silent_server.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "django", *command],
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.worker_settings",
            # A timeout far longer than the test: the command is still waiting at the signal.
            "DQ_TEST_REDIS_URL": f"redis://127.0.0.1:{port}/0?socket_timeout=60",
            "PYTHONPATH": str(ROOT),
            **env,
        },
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        connection, _ = silent_server.accept()
        with connection:
            connection.settimeout(20)
            assert connection.recv(1024)  # its first command sent: it waits for the reply
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # Before: Python's KeyboardInterrupt traceback, and death by SIGINT.
    assert (process.returncode, err) == (INTERRUPTED, f"{command[0]}: interrupted\n"), out
