"""``make demo``'s script: finds or starts Redis, runs the worker and the web server, serves
the pages, and stops every process it started on Ctrl-C."""

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
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


def fetch(port: int, path: str) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("redis_found", ["given", "private"])
def test_the_demo_serves_the_site_and_stops_cleanly(
    redis_server: RedisServer, tmp_path: Path, redis_found: str
) -> None:
    port = free_port()
    env = {**os.environ, "DEMO_PORT": str(port), "DEMO_DATABASE": str(tmp_path / "db.sqlite3")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("REDIS_URL", None)
    if redis_found == "given":
        env["REDIS_URL"] = redis_server.url
    else:  # nothing answers where a local Redis would be: the demo starts its own
        env["DEMO_LOCAL_REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"
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
        if redis_found == "private":
            assert "Started a private redis-server on port" in text
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

        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=60) == 0
        assert "Demo stopped." in out.read_text()
        assert not [pid for pid in children if alive(pid)]
        if private is not None:
            with socket.socket() as sock:
                assert sock.connect_ex(("127.0.0.1", private)) != 0  # its Redis is gone too
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
