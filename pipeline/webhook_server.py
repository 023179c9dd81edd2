"""The HTTP server under ``durafix serve``: a threading server that no client can hold up.

Contract (``ReceiverLimits``):
- At most ``max_connections`` connections are handled at once (a bounded semaphore taken when a connection
  is accepted). One over the cap is answered ``503`` with ``Retry-After`` at once and closed, so the accept
  loop never blocks on a slot and a flood cannot queue work behind itself.
- Every socket read and write has a timeout (``read_timeout_s``): a connection that sends headers and then
  nothing (or sends them too slowly) is closed when it runs out, and its slot is freed. A body that stops
  arriving is answered ``408`` when the socket still takes an answer.
- The body is read only after its ``Content-Length`` was checked by the handler (``body_length``): missing
  is ``411``, not a non-negative decimal integer ``400``, over ``max_body`` ``413``, each before a byte of
  the body is read, so nothing is buffered beyond the limit.
"""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class ReceiverLimits:
    """What one client may cost the receiver. GitHub sends one delivery per connection, at most 25 MB."""

    max_body: int = 25 * 1024 * 1024
    max_connections: int = 64
    read_timeout_s: float = 10.0


class BodyRefused(Exception):
    """The request's declared body is refused before it is read: ``status`` and a message to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def body_length(header: str | None, max_body: int) -> int:
    """The body length ``Content-Length`` declares, or :class:`BodyRefused` (411 missing, 400 malformed or
    negative, 413 over ``max_body``). Only ASCII digits count: ``int()`` alone would take ``-1``, ``+5``,
    ``1_000`` and non-ASCII digits."""
    if header is None or header.strip() == "":
        raise BodyRefused(411, "Content-Length required")
    value = header.strip()
    if not (value.isascii() and value.isdigit()):
        raise BodyRefused(400, f"bad Content-Length {header!r}: not a non-negative integer")
    length = int(value)
    if length > max_body:
        raise BodyRefused(413, f"payload too large: {length} bytes declared, at most {max_body} taken")
    return length


class BoundedHTTPServer(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` with a cap on concurrent connections and a timeout on every socket."""

    daemon_threads = True
    # The default backlog (5) drops connections of a burst before the cap can answer them.
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        limits: ReceiverLimits,
    ) -> None:
        self.limits = limits
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(self.limits.read_timeout_s)
        if not self._slots.acquire(blocking=False):
            # Answered here, on the accept thread, with a short write: no handler thread for a connection
            # over the cap.
            _refuse_busy(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out or went away is not an error of the receiver.
        exc = sys.exc_info()[1]
        if isinstance(exc, (TimeoutError, ConnectionError)):
            return
        super().handle_error(request, client_address)


def _refuse_busy(request: socket.socket) -> None:
    body = b'{"message": "too many concurrent connections; retry later"}'
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    try:
        request.settimeout(1.0)
        request.sendall(head + body)
    except OSError:
        # The refused client went away first; there is nobody left to tell, and the connection is closed anyway.
        return


def handler_class(
    handle_post: Callable[[BaseHTTPRequestHandler], None], limits: ReceiverLimits
) -> type[BaseHTTPRequestHandler]:
    """A request handler class whose POSTs go to ``handle_post``; its socket reads time out after
    ``limits.read_timeout_s`` (``StreamRequestHandler.timeout``), and it logs to stderr."""

    class Handler(BaseHTTPRequestHandler):
        timeout = limits.read_timeout_s
        # One delivery per connection, as GitHub sends them: no keep-alive slot held after the answer.
        protocol_version = "HTTP/1.0"

        def do_POST(self) -> None:
            handle_post(self)

        def log_message(self, format: str, *args: object) -> None:
            print(f"webhook {format % args}", file=sys.stderr, flush=True)

    return Handler
