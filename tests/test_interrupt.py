"""Ctrl-C stops a test run: a pytest run of a small test file that uses the suite's server
fixtures, sent SIGINT as a terminal sends it (to the whole process group), exits within
seconds, prints pytest's summary, and leaves no process behind (no redis-server, no xdist
worker, no worker of the tests).

The inner tests are written to a temporary file and get the suite's fixtures through
``-p tests.conftest``.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(180)

# Each inner test says it is running (a line in the file $DQ_RUNNING) and then waits, as a
# test of the suite would, until something ends it: Ctrl-C should.
INNER_TESTS = """
import os
import time

from django.core.management import call_command


def running(what):
    with open(os.environ["DQ_RUNNING"], "a") as marker:
        marker.write(what + "\\n")


def test_a_worker_run_in_the_tests_process(redis_server, settings):
    settings.DELAYQUEUES = {
        "default": {"URL": redis_server.url, "HANDLER": "tests.worker_handlers.handle"}
    }
    running("worker")
    call_command("run_delayqueue", verbosity=0)  # until stopped
    time.sleep(120)  # the test goes on after the worker stopped


def test_servers_running(redis_server, redis_cluster):
    running("servers")
    time.sleep(120)
"""

# What a loaded 2-core machine needs to stop a run: the KeyboardInterrupt's report, the
# fixtures' teardown (stopping the servers), pytest's summary. An ignored Ctrl-C shows as
# the inner test's 120 s.
PROMPT_SECONDS = 45


def _as_a_terminal_starts_it() -> None:
    """The inner run's signals as a shell gives a foreground job: SIGINT at its default and
    none blocked. A child inherits ignored and blocked signals, and Python keeps SIGINT
    ignored if it starts so; what the test process got from its own parent (an xdist
    worker, CI's shell) or an earlier test must not decide whether Ctrl-C reaches the run."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signal_state(pid: int) -> str:
    """The process's ignored and blocked signals, as the kernel has them."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "its signal state unknown"
    return ", ".join(line for line in status.splitlines() if line.startswith(("SigIgn", "SigBlk")))


def group_is_empty(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize(
    ("selected", "parallel"),
    [("worker", "0"), ("servers", "2")],
    ids=["in-process-worker", "servers-in-xdist"],
)
def test_ctrl_c_stops_the_run_with_a_summary_and_no_process_left(
    tmp_path: Path, selected: str, parallel: str
) -> None:
    tests = tmp_path / "test_interrupted.py"
    tests.write_text(INNER_TESTS)
    marker = tmp_path / "running"
    env = {**os.environ, "DQ_RUNNING": str(marker)}
    env.pop("PYTEST_XDIST_WORKER", None)
    command = [
        sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
        "--rootdir", str(ROOT), "-p", "tests.conftest", "-p", "no:cacheprovider",
        "-n", parallel, "-k", selected, str(tests),
    ]  # fmt: skip
    out = tmp_path / "pytest.log"
    with out.open("w") as log:
        # A process group of its own, as a terminal's foreground job: Ctrl-C reaches every
        # process in it.
        run = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_as_a_terminal_starts_it,
        )
    try:
        wait_for(
            lambda: marker.exists() and selected in marker.read_text(),
            timeout=90,
            what=f"the inner test to run; its output:\n{out.read_text()}",
        )
        time.sleep(1)  # (the worker's signal handlers in place, the test waiting)
        os.killpg(run.pid, signal.SIGINT)
        try:
            code = run.wait(timeout=PROMPT_SECONDS)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"still running {PROMPT_SECONDS} s after Ctrl-C ({_signal_state(run.pid)}):\n"
                f"{out.read_text()}"
            ) from None
        said = out.read_text()
        assert code == pytest.ExitCode.INTERRUPTED, said
        assert "KeyboardInterrupt" in said
        # pytest's closing summary line, e.g. "==== no tests ran in 12.34s ====".
        assert said.rstrip().splitlines()[-1].startswith("="), said
        assert " in " in said.rstrip().splitlines()[-1], said
        wait_for(lambda: group_is_empty(run.pid), timeout=10, what="every process to exit")
    finally:
        if not group_is_empty(run.pid):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()
