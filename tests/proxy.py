"""A TCP proxy between parties and the coordinator that a test can cut, as a network does: a
reset NAT entry, a restarted load balancer, a flaky VPN."""

from __future__ import annotations

import contextlib
import socket
import threading


class Proxy:
    """Listens on a free local port and forwards each connection to `target`. `cut()` closes every
    connection through it at once (both ends see the socket close mid-stream); `refuse()` cuts and
    then closes every new connection as it comes; `admit()` forwards again."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._refusing = False
        self.cuts = 0
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            with self._lock:
                if self._refusing:
                    client.close()
                    continue
                try:
                    upstream = socket.create_connection(self.target, timeout=5)
                except OSError:
                    client.close()
                    continue
                upstream.settimeout(None)
                self._open += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._open.clear()
            self.cuts += 1

    def refuse(self) -> None:
        with self._lock:
            self._refusing = True
        self.cut()

    def admit(self) -> None:
        with self._lock:
            self._refusing = False

    def close(self) -> None:
        self._listener.close()
        self.refuse()
