"""``make demo``: the queue engine at work against a real Redis, in a minute.

Finds Redis (REDIS_URL; else 127.0.0.1:6379 if it answers; else a private redis-server
with its data under .demo/), migrates the example site, then sends messages with delays
and consumes them, printing what happens: on-time delivery, a cancel, retries with
backoff and a dead letter. Until the worker command exists, the demo drives the engine
directly; it only touches keys under its own prefix.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATE = ROOT / ".demo"


def answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_redis() -> tuple[str, "subprocess.Popen[bytes] | None"]:
    if url := os.environ.get("REDIS_URL"):
        if not answers(url):
            sys.exit(f"REDIS_URL={url} does not answer.")
        return url, None
    if answers("redis://127.0.0.1:6379/0"):
        return "redis://127.0.0.1:6379/0", None
    if shutil.which("redis-server") is None:
        sys.exit(
            "No Redis found: set REDIS_URL, start Redis on 127.0.0.1:6379, or install "
            "redis-server (Debian/Ubuntu: sudo apt-get install redis-server; macOS: brew "
            "install redis) so the demo can start a private one."
        )
    port = free_port()
    data = STATE / "redis"
    data.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        if answers(url):
            print(f"Started a private redis-server on port {port} (data in {data}).")
            return url, process
        time.sleep(0.05)
    process.terminate()
    sys.exit("The private redis-server did not start; see its output above.")


def run_demo() -> None:
    from delayqueue_django import cancel, get_queue, send

    queue = get_queue()
    queue.purge_garbage()
    sent_at = time.monotonic()
    ids = {
        send({"event": "reminder"}, delay=0.5): "reminder (due in 0.5 s)",
        send({"event": "order-timeout"}, delay=1.0): "order timeout (due in 1.0 s)",
        send({"event": "fails on purpose"}, delay=1.5): "failing job (due in 1.5 s)",
    }
    paid = send({"event": "order-timeout", "paid": True}, delay=1.2)
    print(f"Sent 4 messages; {queue.stats()['pending']} pending.")
    print(f"Order paid in time: cancel() -> {cancel(paid)}, so it will never be delivered.")

    while True:
        fetched = queue.fetch()
        for message in fetched.messages:
            label = ids[message.id]
            elapsed = time.monotonic() - sent_at
            if message.payload["event"] == "fails on purpose":
                outcome = queue.nack([message])[0]
                verdict = "exhausted -> garbage" if outcome.exhausted else "nack -> retry"
                print(f"  {elapsed:5.2f}s  {label}: attempt {message.attempt}, {verdict}")
            else:
                queue.ack([message])
                print(f"  {elapsed:5.2f}s  {label}: attempt {message.attempt}, acked")
        if fetched.next_ms is None:
            break
        if not fetched.messages:
            time.sleep(max(fetched.next_ms - fetched.now_ms, 1) / 1000)

    stats = queue.stats()
    print("Final counts:", {k: stats[k] for k in ("pending", "ready", "unack", "retry", "garbage")})
    [dead] = queue.list_messages("garbage")
    print(f"Dead letter {dead.id}: payload {dead.payload}, after {dead.attempt} attempts.")
    queue.purge_garbage()


def main() -> None:
    STATE.mkdir(exist_ok=True)
    url, private = find_redis()
    os.environ["REDIS_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_site.settings")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        print(f"delayqueue_django demo against {url}")
        run_demo()
    finally:
        if private is not None:
            private.terminate()
            private.wait(timeout=10)


if __name__ == "__main__":
    main()
