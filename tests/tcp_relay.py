"""A TCP relay between the code under test and a private redis-server, to drop connections
silently, as a NAT or firewall does when it forgets a flow: ``freeze()`` stops forwarding on
every connection open at that moment, closing neither side, so both ends wait for bytes that
never come. Connections opened afterwards are forwarded as usual, as a new flow through the
same NAT would be.

The relay's own kernel still acknowledges what each side sends, so TCP keepalive cannot see
the drop: only a reply that does not come in time (a socket timeout, an unanswered PING)
can. Everything runs on 127.0.0.1.
"""

import contextlib
import select
import socket
import threading

# How often the relay's threads look at their stop flags.
POLL_SECONDS = 0.05
CHUNK = 65536


class _Pair:
    """One relayed connection: the client's socket and the relay's own to the target."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.frozen = threading.Event()
        self.closed = threading.Event()
        self._thread = threading.Thread(target=self._forward, daemon=True)
        self._thread.start()

    def _forward(self) -> None:
        peers = {self.client: self.server, self.server: self.client}
        try:
            while not self.closed.is_set() and not self.frozen.is_set():
                readable, _, _ = select.select(list(peers), [], [], POLL_SECONDS)
                if self.frozen.is_set():
                    break  # what arrived meanwhile is never passed on
                for source in readable:
                    data = source.recv(CHUNK)
                    if not data:  # one side closed: an ordinary close, passed on
                        self.close()
                        return
                    peers[source].sendall(data)
        except OSError:
            self.close()
            return
        # Frozen: hold both sockets open, forwarding nothing, until the relay is closed.
        self.closed.wait()

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.close()

    def join(self) -> None:
        self._thread.join(timeout=5)


class TcpRelay:
    """Listens on a free port of 127.0.0.1 and forwards each connection to ``target_port``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(POLL_SECONDS)
        self.port = int(self._listener.getsockname()[1])
        self._pairs: list[_Pair] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            client.settimeout(None)
            server.settimeout(None)
            with self._lock:
                self._pairs.append(_Pair(client, server))

    def open_connections(self) -> int:
        """Connections relayed now (not closed, frozen ones included)."""
        with self._lock:
            return sum(not pair.closed.is_set() for pair in self._pairs)

    def freeze(self) -> int:
        """Stop forwarding on every open connection, closing none; returns how many."""
        with self._lock:
            live = [pair for pair in self._pairs if not pair.closed.is_set()]
        for pair in live:
            pair.frozen.set()
        return len(live)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        self._acceptor.join(timeout=5)
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()
            pair.join()
