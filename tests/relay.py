"""A loopback TCP relay whose stop takes the endpoint away, open connections included,
and whose freeze makes it hang (a store that stops answering)."""

from __future__ import annotations

import contextlib
import socket
import threading


class Relay:
    """A loopback TCP relay to an HTTP server whose :meth:`stop` closes the listening
    socket and every open connection: the endpoint is gone, kept-alive connections too.
    After :meth:`freeze` it forwards nothing more, on open and new connections alike,
    and closes none: every request hangs until the client's timeout."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").rstrip("/").split(":")
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.sockets: list[socket.socket] = [self.listener]
        self.lock = threading.Lock()
        self.frozen = threading.Event()
        #: set once a frozen relay swallowed bytes: a request hangs on it now
        self.swallowed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.upstream)
            except OSError:
                return
            with self.lock:
                self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.frozen.is_set():  # swallowed, never answered
                    self.swallowed.set()
                else:
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def freeze(self) -> None:
        """Forward nothing from now on: the endpoint hangs (connections stay open)."""
        self.frozen.set()

    def stop(self) -> None:
        with self.lock:
            for s in self.sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self.sockets = []
