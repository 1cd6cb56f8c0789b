"""How the admin pages show what Redis holds: times, payloads (indented while that stays
small), sizes, a sharded queue's table of shards, a task's arguments, a payload's file
name."""

import json
import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from delayqueue_django.core.encoding import decode_payload

# The message page shows at most this much of a payload, cut in Redis (peek's
# preview_bytes): MAX_PAYLOAD_BYTES may be up to 512 MiB, and the whole of such a payload
# would cross the wire, fill the web process and make a page of its size. 64 KiB is still
# far more than one reads on a page, and costs a page about what a list page of previews
# does; the whole payload is a download (the payload view).
MESSAGE_PAYLOAD_BYTES = 64 * 1024
# A payload is shown indented only while its indented form stays within this many
# characters: indenting nests each level two spaces deeper on every line under it, so a
# short payload nested deep could otherwise still make a page of megabytes.
INDENTED_CHARS = 4 * MESSAGE_PAYLOAD_BYTES
COUNT_NAMES = ("pending", "ready", "unack", "retry", "garbage")


def as_datetime(ms: int | None) -> datetime | None:
    if ms is None or ms < 0:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def pretty_payload(text: str | None, max_chars: int = INDENTED_CHARS) -> str:
    """The payload indented, or as stored when it is no JSON this process can decode or
    its indented form would be longer than ``max_chars`` (given up on as soon as it is)."""
    if text is None:
        return ""
    encoder = json.JSONEncoder(indent=2, ensure_ascii=False, sort_keys=True)
    parts, length = [], 0
    try:
        for part in encoder.iterencode(decode_payload(text)):
            length += len(part)
            if length > max_chars:
                return text
            parts.append(part)
    except (ValueError, RecursionError):  # shown as stored when it cannot be pretty-printed
        return text
    return "".join(parts)


def binary_size(size: int) -> str:
    """A size in bytes as people read it: "900 bytes", "64.0 KiB", "6.0 MiB"."""
    if size < 1024:
        return f"{size} bytes"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KiB"
    return f"{size / (1024 * 1024):.1f} MiB"


def shard_table(shards: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    """The queue page's table of shards (none for an unsharded queue): each shard's name,
    hash tag, slot and server on Redis Cluster, and its counts, next due time and lag, or
    the error of a shard whose Redis cannot be reached."""
    if shards is None:
        return {"shards": []}
    rows = []
    for name, shard in shards.items():
        row = {key: shard[key] for key in ("tag", "slot", "server")}
        row.update(name=name, ok=shard["ok"])
        if shard["ok"]:
            row.update(
                counts=[(count, shard[count]) for count in COUNT_NAMES],
                next_due=as_datetime(shard["next_due_ms"]),
                lag_ms=shard["lag_ms"],
            )
        else:
            row["error"] = shard["error"]
        rows.append(row)
    return {
        "shards": rows,
        "shards_on_cluster": any(row["slot"] is not None for row in rows),
        "count_names": COUNT_NAMES,
    }


def call_arguments(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    shown = [json.dumps(arg) for arg in args]
    shown += [f"{key}={json.dumps(value)}" for key, value in kwargs.items()]
    text = ", ".join(shown)
    return text if len(text) <= 200 else text[:200] + "…"


def download_name(queue_name: str, message_id: str) -> str:
    """A file name for a payload: ids may hold slashes, line breaks or anything else, which
    no file name (nor header) should."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{queue_name}-{message_id}") + ".json"


def from_epoch(seconds: Any) -> datetime | None:
    if not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return None
    return datetime.fromtimestamp(seconds, tz=UTC)
