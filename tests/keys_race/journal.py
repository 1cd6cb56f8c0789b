"""What each process of the race did, one JSON line per event in a file of its own (one
``os.write`` per line, O_APPEND), read back by the test once every process has stopped."""

import json
import os
from pathlib import Path
from typing import Any

_files: dict[tuple[Path, int], int] = {}


def write(folder: Path, event: dict[str, Any]) -> None:
    pid = os.getpid()
    fd = _files.get((folder, pid))
    if fd is None:
        fd = os.open(folder / f"{pid}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        _files[(folder, pid)] = fd
    os.write(fd, (json.dumps(event) + "\n").encode())


def read(folder: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(folder.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
