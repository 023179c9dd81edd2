"""A TLS terminator in front of a plaintext gRPC server, as an ingress or load balancer is in front of a
self-hosted Temporal cluster: it does the TLS handshake (requiring and verifying a client certificate when told
to, which is mTLS), then pipes the bytes to the server unchanged. The Temporal dev server has no TLS options of
its own, so this is how a test reaches it over real TLS."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TlsProxy:
    """A listening proxy: ``address`` is what clients dial; ``refused`` the handshake errors it saw, and
    ``clients`` the common name of each client certificate it accepted."""

    address: str
    refused: list[str] = field(default_factory=list)
    clients: list[str] = field(default_factory=list)
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def note_refused(self, reason: str) -> None:
        with self._changed:
            self.refused.append(reason)
            self._changed.notify_all()

    def refusals(self, at_least: int, within_s: float = 10.0) -> list[str]:
        """The handshake errors once there are ``at_least`` of them (or after ``within_s``): a client gives up
        on a handshake a moment before the proxy's thread has recorded why."""
        with self._changed:
            self._changed.wait_for(lambda: len(self.refused) >= at_least, timeout=within_s)
            return list(self.refused)


def server_context(cert: Path, key: Path, client_ca: Path | None) -> ssl.SSLContext:
    """A TLS 1.2+ server context offering HTTP/2 (gRPC needs ALPN ``h2``), verifying client certificates
    against ``client_ca`` when given (mTLS)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["h2"])
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)
    return context


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    # Either side ending ends the connection both ways (a gRPC channel never half-closes on purpose).
    for sock in (source, sink):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def tls_proxy(upstream: str, context: ssl.SSLContext) -> Iterator[TlsProxy]:
    """Listen on a free loopback port with ``context`` and forward every connection whose handshake succeeds to
    ``upstream`` (``host:port``, plaintext); a thread per direction of each connection."""
    host, port = upstream.rsplit(":", 1)
    listener = socket.create_server(("127.0.0.1", 0))
    proxy = TlsProxy(address=f"127.0.0.1:{listener.getsockname()[1]}")
    open_sockets: list[socket.socket] = []
    stopping = threading.Event()

    def serve(raw: socket.socket) -> None:
        raw.settimeout(10)
        try:
            tls = context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError) as err:
            proxy.note_refused(str(err))
            raw.close()
            return
        tls.settimeout(None)
        peer = tls.getpeercert()
        if peer:
            # The subject is a tuple of relative names, each a tuple of (attribute, value) pairs.
            names = [pair[1] for rdn in peer.get("subject", ()) for pair in rdn if pair[0] == "commonName"]
            proxy.clients.append(str(names[0]) if names else "")
        server = socket.create_connection((host, int(port)))
        open_sockets.extend((tls, server))
        threading.Thread(target=_pipe, args=(server, tls), daemon=True).start()
        _pipe(tls, server)

    def accept() -> None:
        while not stopping.is_set():
            try:
                raw, _ = listener.accept()
            except OSError:
                return
            open_sockets.append(raw)
            threading.Thread(target=serve, args=(raw,), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield proxy
    finally:
        stopping.set()
        # shutdown wakes the blocked accept (close alone does not on Linux).
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        for sock in open_sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        acceptor.join(timeout=5)
