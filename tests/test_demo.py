"""``make demo``'s script: starts Redis-backed worker and web server, serves the pages, and
stops every process it started on Ctrl-C."""

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.redis_servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(120)
def test_the_demo_serves_the_site_and_stops_cleanly(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "REDIS_URL": redis_server.url,
        "DEMO_PORT": str(port),
        "DEMO_DATABASE": str(tmp_path / "db.sqlite3"),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    out = tmp_path / "demo.log"
    with out.open("w") as log:
        demo = subprocess.Popen(
            [sys.executable, str(ROOT / "example_project" / "demo.py")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(
            lambda: "Ctrl-C stops everything" in out.read_text(),
            timeout=60,
            what="the demo to start",
        )
        text = out.read_text()
        assert f"Shop:   http://127.0.0.1:{port}/" in text
        assert "password 'demo-admin'" in text
        found = re.search(r"Worker pid (\d+), web server pid (\d+)", text)
        assert found is not None
        children = [int(found.group(1)), int(found.group(2))]

        def page(path: str) -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                return str(response.read().decode())

        home = wait_for(lambda: _try(page, "/"), timeout=30, what="the site to answer")
        assert "A shop with order timers" in home
        assert "Log in" in page("/admin/login/")

        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=60) == 0
        assert "Demo stopped." in out.read_text()
        assert not [pid for pid in children if alive(pid)]
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()


def _try(page: Callable[[str], str], path: str) -> str | None:
    try:
        return page(path)
    except OSError:
        return None
