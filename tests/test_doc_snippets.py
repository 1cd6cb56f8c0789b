"""The documentation's snippets, run as a newcomer pastes them: into a project made by
``django-admin startproject`` with an app made by ``startapp``, against the private Redis.

A snippet is the code block after a ``<!-- snippet-test: NAME -->`` line, in any page of
``docs/`` (the quickstart, the signals and the Tasks guides; the testing guide's is run
by tests/test_testing.py, with the fixture it names, and the keys guide's first by
tests/test_keys_api.py, on a memory queue); each name is used once.
"""

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from delayqueue_django.engine.store.replies import STATS_NAMES
from tests.helpers import wait_for
from tests.redis_servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = {path: path.read_text() for path in sorted(DOCS.rglob("*.md"))}
# The Redis the snippets name, replaced by the test's private one.
DOCS_REDIS = "redis://127.0.0.1:6379"

pytestmark = pytest.mark.timeout(120)


def snippet(name: str) -> str:
    pattern = rf"<!-- snippet-test: {name} -->\n```\w+\n(.*?)\n```\n"
    found = [
        (path, match)
        for path, text in PAGES.items()
        for match in re.finditer(pattern, text, re.DOTALL)
    ]
    assert len(found) == 1, f"snippet {name!r} found {len(found)} times in docs/"
    return found[0][1].group(1) + "\n"


class Project:
    """A fresh startproject with a startapp, the package importable from this checkout."""

    def __init__(self, path: Path, redis_url: str) -> None:
        self.path = path
        self.redis_url = redis_url.removesuffix("/0")
        self.env = {
            **{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",  # a handler's print() shows at once, as in a terminal
        }
        path.mkdir()
        subprocess.run(
            [sys.executable, "-m", "django", "startproject", "mysite", str(path)],
            check=True,
            env=self.env,
        )
        self.manage("startapp", "shop")

    def command(self, *args: str) -> list[str]:
        return [sys.executable, str(self.path / "manage.py"), *args]

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            self.command(*args), cwd=self.path, env=self.env, capture_output=True, text=True
        )
        assert done.returncode == 0, f"manage.py {' '.join(args)}:\n{done.stdout}{done.stderr}"
        return done.stdout + done.stderr

    def shell(self, code: str) -> str:
        return self.manage("shell", "--no-imports", "-c", code)

    def paste(self, name: str, into: str, *, append: bool = False) -> None:
        """The snippet as written, but for the Redis it points at (the test's private one)."""
        text = snippet(name).replace(DOCS_REDIS, self.redis_url)
        target = self.path / into
        target.write_text((target.read_text() if append else "") + "\n" + text)

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command(*args),
            cwd=self.path,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )


@pytest.fixture
def project(tmp_path: Path, redis_server: RedisServer) -> Project:
    made = Project(tmp_path / "mysite", redis_server.url)
    made.paste("settings", "mysite/settings.py", append=True)
    made.paste("handlers", "shop/handlers.py")
    return made


@pytest.fixture
def worker(project: Project) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    process = project.start("run_delayqueue")
    lines: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    yield process, lines
    if process.poll() is None:
        process.kill()
        process.wait()


def test_the_quickstart_handles_a_message(
    project: Project, worker: tuple[subprocess.Popen[str], list[str]]
) -> None:
    assert "System check identified no issues (0 silenced)." in project.manage("check")
    project.manage("migrate", "--verbosity", "0")
    process, lines = worker
    send = shlex.split(snippet("send"))
    assert send[:2] == ["python", "manage.py"]
    project.manage(*send[2:])
    wait_for(
        lambda: "handling {'hello': 'world'} (attempt 1)\n" in lines,
        timeout=30,
        what=f"the quickstart's handler output; so far:\n{''.join(lines)}",
    )
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0


def test_the_receiver_example_fires_in_the_worker(
    project: Project, worker: tuple[subprocess.Popen[str], list[str]]
) -> None:
    project.paste("receivers", "shop/receivers.py")
    project.paste("apps", "shop/apps.py")
    process, lines = worker
    # Without "to", send_email raises; with no retry left the message is exhausted.
    message_id = project.shell(
        "import delayqueue_django; "
        "print(delayqueue_django.send({'no': 'address'}, queue='emails', retry_count=0))"
    ).strip()
    wait_for(
        lambda: f"gave up on message {message_id} of queue emails after 1 attempts\n" in lines,
        timeout=30,
        what=f"the receiver's log line; so far:\n{''.join(lines)}",
    )
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0


def test_the_tasks_example_runs_beside_the_handler_queues(project: Project) -> None:
    # As written on Django 5.2 and 6.x alike: the snippet itself says which needs the backport.
    project.paste("tasks-settings", "mysite/settings.py", append=True)
    project.paste("tasks", "shop/tasks.py")
    # Before: E103 (the task queue was the handler queue) and a false E102.
    assert "System check identified no issues (0 silenced)." in project.manage("check")
    assert project.shell(snippet("tasks-enqueue") + "print(result.status)").strip() == "READY"

    task_id = project.shell(
        "from shop.tasks import send_receipt\nprint(send_receipt.enqueue(42).id)"
    ).strip()
    project.manage("run_delayqueue", "tasks", "--burst", "--verbosity", "0")
    outcome = project.shell(
        "from shop.tasks import send_receipt\n"
        f"result = send_receipt.get_result({task_id!r})\n"
        "print(result.status, result.return_value)"
    )
    assert outcome.strip() == "SUCCESSFUL receipt for order 42 sent"


def test_the_async_example_waits_its_second_together(project: Project) -> None:
    project.paste("async-settings", "mysite/settings.py", append=True)
    project.paste("async-handler", "shop/handlers.py", append=True)
    assert "System check identified no issues (0 silenced)." in project.manage("check")
    project.shell("import delayqueue_django as dq; [dq.send(n, queue='slow') for n in range(200)]")
    started = time.monotonic()
    said = project.manage("run_delayqueue", "slow", "--burst", "--async-concurrency", "200")
    took = time.monotonic() - started
    # The worker's log lines share stdout with the handlers' prints, and print() writes its
    # text and its newline apart: a log line may land between the two ("called for 45"
    # then "2026-11-29 ... INFO ..."). Take the log lines out before reading the prints.
    prints = re.sub(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ delayqueue_django[^\n]*\n", "", said
    )
    assert sorted(re.findall(r"called for (\d+)", prints), key=int) == [str(n) for n in range(200)]
    assert "async concurrency 200 on an event loop" in said
    # One second of waiting, together: far from the 200 seconds one at a time would take
    # (the rest is the process starting, on a machine that may be busy).
    assert took < 30


def test_every_stats_key_is_listed() -> None:
    reference = PAGES[DOCS / "reference" / "metrics.md"]
    listing = reference[reference.index("## `Queue.stats()`") :]
    listing = listing[: listing.index("\n## ", 1)]
    keys = (*STATS_NAMES, "shards_down")  # (the last added by Queue.stats)
    assert [name for name in keys if f"| `{name}` |" not in listing] == []


def test_every_marked_snippet_is_run() -> None:
    marked = {
        name
        for text in PAGES.values()
        for name in re.findall(r"<!-- snippet-test: ([\w-]+) -->\n```", text)
    }
    run = {
        "settings",
        "handlers",
        "send",
        "receivers",
        "apps",
        "tasks-settings",
        "tasks",
        "tasks-enqueue",
        "async-settings",
        "async-handler",
        "testing-dead-letter",  # in tests/test_testing.py
        "keys-first",  # in tests/test_keys_api.py
    }
    assert marked == run
