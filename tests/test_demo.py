"""``make demo``'s script runs end to end against Redis."""

import os
import subprocess
import sys
from pathlib import Path

from tests.redis_servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_runs_against_the_given_redis(redis_server: RedisServer, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "REDIS_URL": redis_server.url,
        "DEMO_DATABASE": str(tmp_path / "db.sqlite3"),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run(
        [sys.executable, str(ROOT / "example_project" / "demo.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"demo against {redis_server.url}" in out
    assert "cancel() -> True" in out
    assert "reminder (due in 0.5 s): attempt 1, acked" in out
    assert "attempt 3, exhausted -> garbage" in out
    assert "'garbage': 1" in out
