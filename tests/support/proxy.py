"""A TCP proxy on the loopback that a test can cut: a database or a Redis that stops answering and comes back."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

from tests.support.processes import free_port

#: Bytes moved per read.
_CHUNK = 65536


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``127.0.0.1:target_port``.

    :meth:`cut` drops every connection and refuses new ones (a server that crashed), until
    :meth:`restore`.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None

    def start(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port))  # SO_REUSEADDR: bound again after a cut
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            dropped, self._sockets = self._sockets, set()
        for sock in [listener, *dropped]:
            if sock is not None:
                _close(sock)

    def restore(self) -> None:
        self.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                _close(client)
                continue
            with self._lock:
                if self._listener is not listener:
                    _close(client)
                    _close(server)
                    return
                self._sockets |= {client, server}
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(_CHUNK):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            # One side closed: close both, as a server that went away would.
            with self._lock:
                self._sockets -= {source, sink}
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@contextlib.contextmanager
def tcp_proxy(target_port: int) -> Iterator[TcpProxy]:
    """A started :class:`TcpProxy` to ``target_port``, cut at the end."""
    proxy = TcpProxy(target_port)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.cut()
