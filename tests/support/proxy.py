"""A loopback TCP proxy in front of the apiserver, to make it slow or flaky for one client.

TLS passes through untouched (the apiserver's certificate names 127.0.0.1, whatever the port),
so the proxy cannot see requests; it works on connections and bytes:

* ``delay``: every chunk from the apiserver reaches the client ``delay`` seconds late
  (requests are not delayed: a write lands on time, only its answer is late).
* ``cut_after``: a connection is closed once the client has sent nothing for ``cut_after``
  seconds, dropping what the apiserver sends meanwhile. Short requests complete; watch
  streams (the client sends its request once, then only reads) die after ``cut_after``
  seconds, every time; idle keep-alive connections are closed too (clients reconnect).

``kubeconfig(src, dst)`` writes a copy of a kubeconfig that points at the proxy.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque
from pathlib import Path

import yaml


class Proxy:
    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream = (host, upstream_port)
        self.delay = 0.0
        self.cut_after = 0.0
        self.connections = 0
        self.cuts = 0
        self._listener = socket.create_server((host, 0))
        self.port = int(self._listener.getsockname()[1])
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, name="proxy", daemon=True)
        self._thread.start()

    def kubeconfig(self, src: Path, dst: Path) -> Path:
        """A copy of kubeconfig ``src`` whose server is this proxy."""
        doc = yaml.safe_load(src.read_text())
        for cluster in doc.get("clusters") or []:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        dst.write_text(yaml.safe_dump(doc, sort_keys=False))
        return dst

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            socks, self._open = list(self._open), set()
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._open.update((client, server))
                self.connections += 1
            state = {"last_sent": time.monotonic()}
            for target, args in ((self._upstream, (client, server, state)),
                                 (self._downstream, (server, client, state))):
                threading.Thread(target=target, args=args, daemon=True).start()

    def _close(self, *socks: socket.socket) -> None:
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
            with self._lock:
                self._open.discard(s)

    def _upstream(self, client: socket.socket, server: socket.socket,
                  state: dict[str, float]) -> None:
        """client -> apiserver, at once; closes the pair when cut."""
        client.settimeout(0.2)
        try:
            while not self._stop.is_set():
                try:
                    data = client.recv(65536)
                except TimeoutError:
                    if self.cut_after and time.monotonic() - state["last_sent"] > self.cut_after:
                        self.cuts += 1
                        break
                    continue
                if not data:
                    break
                state["last_sent"] = time.monotonic()
                server.sendall(data)
        except OSError:
            pass
        self._close(client, server)

    def _downstream(self, server: socket.socket, client: socket.socket,
                    state: dict[str, float]) -> None:
        """apiserver -> client, each chunk `delay` seconds late."""
        queue: deque[tuple[float, bytes]] = deque()
        done = threading.Event()
        cond = threading.Condition()

        def sender() -> None:
            try:
                while True:
                    with cond:
                        while not queue and not done.is_set():
                            cond.wait(0.2)
                        if not queue:
                            return
                        due, data = queue[0]
                    wait = due - time.monotonic()
                    if wait > 0:
                        time.sleep(min(wait, 0.05))
                        continue
                    with cond:
                        queue.popleft()
                    client.sendall(data)
            except OSError:
                pass
            self._close(client, server)

        t = threading.Thread(target=sender, daemon=True)
        t.start()
        try:
            while not self._stop.is_set():
                data = server.recv(65536)
                if not data:
                    break
                with cond:
                    queue.append((time.monotonic() + self.delay, data))
                    cond.notify()
        except OSError:
            pass
        done.set()
        with cond:
            cond.notify()
