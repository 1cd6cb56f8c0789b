"""One producer of the race, run as ``python -m tests.keys_race.producer FOLDER NAME SECONDS
KEYS`` with the fleet's environment: for SECONDS, in random order, sends with one of KEYS
shared keys (keep, replace or error; sometimes unique_for; some payloads fail once), cancels
and reschedules by key and by id. Every call and its answer goes to its journal in FOLDER.

Sends and cancels by key go through the store, whose answers say what they did (created,
kept, replaced or held; which id a cancel removed), which the public API folds into an id
or a bool; the rest go through the Queue's public API."""

import random
import sys
import time
from pathlib import Path
from typing import Any

import django

from delayqueue_django.core.encoding import encode_payload, new_message_ids
from delayqueue_django.core.queue import Queue
from delayqueue_django.engine.errors import DuplicateKey
from delayqueue_django.engine.records import NewMessage
from tests.keys_race import journal

HOLD_MS = 150
MAX_DELAY_US = 200_000
FAILING = 0.2  # the share of sends whose content fails its first delivery (see handler)


def run(queue: Queue, folder: Path, name: str, seconds: float, keys: list[str]) -> None:
    rng = random.Random(f"{name}-{time.time_ns()}")
    recent: list[str] = []  # ids this producer was answered with, to address by id
    sends = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        key = rng.choice(keys)
        roll = rng.random()
        event: dict[str, Any]
        if roll < 0.55 or not recent:
            sends += 1
            event = send(queue, rng, key, f"{name}-{sends}")
            if event.get("id"):
                recent = [*recent[-9:], event["id"]]
        elif roll < 0.67:
            event = {"op": "cancel_key", "key": key, "removed": queue.store.cancel_key(key)}
        elif roll < 0.75:
            message_id = rng.choice(recent)
            event = {"op": "cancel_id", "id": message_id, "removed": queue.cancel(message_id)}
        elif roll < 0.9:
            done = queue.reschedule(key=key, delay=rng.uniform(0, MAX_DELAY_US / 1e6))
            event = {"op": "reschedule_key", "key": key, "done": done}
        else:
            message_id = rng.choice(recent)
            done = queue.reschedule(message_id, delay=rng.uniform(0, MAX_DELAY_US / 1e6))
            event = {"op": "reschedule_id", "id": message_id, "done": done}
        journal.write(folder, event)
        time.sleep(rng.uniform(0, 0.003))


def send(queue: Queue, rng: random.Random, key: str, token: str) -> dict[str, Any]:
    """One keyed send through the store; its journal event (``outcome`` "error" for a
    DuplicateKey refusal, with the id it named)."""
    new_id = queue.store.place(new_message_ids(1), [key])[0]
    message = NewMessage(
        id=new_id,
        payload=encode_payload(
            {"send": token, "fail": rng.random() < FAILING}, max_bytes=10_000, queue=queue.name
        ),
        budget=3,
        delay_us=rng.choice((0, rng.randrange(MAX_DELAY_US))),
        key=key,
        if_exists=rng.choice(("keep", "keep", "replace", "replace", "error")),
        unique_ms=HOLD_MS if rng.random() < 0.05 else 0,
    )
    event = {
        "op": "send",
        "key": key,
        "new_id": new_id,
        "send": token,
        "if_exists": message.if_exists,
        "unique_ms": message.unique_ms,
    }
    try:
        [sent] = queue.store.send_keyed([message])
    except DuplicateKey as refusal:
        return {**event, "outcome": "error", "id": refusal.message_id, "held": refusal.held}
    return {**event, "outcome": sent.outcome, "id": sent.id}


def main() -> None:
    folder, name, seconds, keys = sys.argv[1:5]
    django.setup()
    from delayqueue_django import get_queue  # after setup: the queue reads the settings

    run(get_queue(), Path(folder), name, float(seconds), keys.split(","))


if __name__ == "__main__":
    main()
