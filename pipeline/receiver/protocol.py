"""The connection guard under the receiver's ASGI app: uvicorn's h11 protocol with the limits a webhook
endpoint on the internet needs and uvicorn does not give by itself.

Contract (``ReceiverLimits``):
- At most ``max_connections`` connections are open at once. One over the cap is answered ``503`` with
  ``Retry-After`` as soon as it is accepted, before anything is read from it, and closed.
- A connection must deliver its request head (request line and headers, at most ``MAX_HEAD`` bytes, else
  ``431``) within ``read_timeout_s`` of being accepted; otherwise it is closed without an answer. uvicorn's own
  keep-alive timeout only starts after a first answer, so a client that connects and sends nothing (or
  trickles its headers) would hold its slot forever without this.
- A ``POST`` head's ``Content-Length`` is judged here, before h11 parses it and before a byte of the body is
  taken (``body_length``): present but empty ``411``, not a non-negative decimal ``400``, over ``max_body``
  ``413``, several disagreeing values ``400``. h11 would refuse most of these too, but as a bare ``400`` with a
  text body; here the answer says why, as JSON, like every other answer of the receiver. A missing
  ``Content-Length`` is the app's to answer (``411``).
- A head h11 cannot parse is answered ``400`` with a JSON message instead of uvicorn's text.
- Every answer given here closes the connection gracefully: the answer is written, the write side shut, and
  what the client still sends is read and dropped until it closes or a short linger runs out. Closing with
  unread data would reset the connection, and the client would lose the answer.
- Every refusal given here is reported to ``on_refusal(event, status, message)`` (event from the head when
  one was read, else ``""``), so it is counted and logged like a delivery the app answered.
"""

from __future__ import annotations

import asyncio
import http
import json
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from pipeline.receiver.limits import BodyRefused, ReceiverLimits, body_length

MAX_HEAD = 16 * 1024  # h11's own limit for an incomplete event: a head larger than this is never parsed
BUSY_LINGER_S = 1.0

Refusal = Callable[[str, int, str], None]


def _answer(status: int, message: str, extra_headers: str = "") -> bytes:
    body = json.dumps({"message": message}).encode()
    phrase = http.HTTPStatus(status).phrase
    head = (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: application/json\r\n{extra_headers}"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def _headers(head: bytes) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The method and the (lower-cased name, stripped value) header pairs of a request head. Lines without a
    colon are skipped: h11 refuses such a head anyway, this only looks for what to refuse first."""
    request_line, _, rest = head.partition(b"\r\n")
    method = request_line.split(b" ", 1)[0]
    pairs: list[tuple[bytes, bytes]] = []
    for line in rest.split(b"\r\n"):
        name, sep, value = line.partition(b":")
        if sep:
            pairs.append((name.strip().lower(), value.strip()))
    return method, pairs


def head_refusal(head: bytes, max_body: int) -> BodyRefused | None:
    """Why a request head is refused before its body, or None when it may go on to h11 and the app."""
    method, pairs = _headers(head)
    lengths = [value for name, value in pairs if name == b"content-length"]
    if method != b"POST" or not lengths:
        return None
    if len(set(lengths)) > 1:
        return BodyRefused(400, "conflicting Content-Length headers")
    try:
        body_length(lengths[0].decode("latin-1"), max_body)
    except BodyRefused as refused:
        return refused
    return None


def _event_of(head: bytes) -> str:
    _, pairs = _headers(head)
    for name, value in pairs:
        if name == b"x-github-event":
            return value.decode("latin-1")
    return ""


def guarded_protocol(limits: ReceiverLimits, on_refusal: Refusal) -> type[H11Protocol]:
    """The h11 protocol class enforcing ``limits`` (see the module's contract), for ``uvicorn.Config(http=)``."""

    class GuardedH11Protocol(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head = bytearray()
            self._head_done = False
            self._closing = False
            self._timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                on_refusal("", 503, "too many concurrent connections; retry later")
                self._refuse_and_linger(
                    _answer(503, "too many concurrent connections; retry later", "Retry-After: 1\r\n"),
                    BUSY_LINGER_S,
                )
                return
            self._timer = self.loop.call_later(limits.read_timeout_s, self._head_timed_out)

        def data_received(self, data: bytes) -> None:
            if self._closing:
                # Lingering after an answer given here: the rest is read only to be dropped.
                return
            if self._head_done:
                super().data_received(data)
                return
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) > MAX_HEAD:
                    self._refuse(_event_of(bytes(self._head)), 431, f"request head over {MAX_HEAD} bytes")
                return
            self._head_done = True
            self._cancel_timer()
            head = bytes(self._head[:end])
            refused = head_refusal(head, limits.max_body)
            if refused is not None:
                self._refuse(_event_of(head), refused.status, refused.message)
                return
            buffered = bytes(self._head)
            self._head.clear()
            super().data_received(buffered)

        def eof_received(self) -> None:
            # Returning None lets asyncio close the transport: a client that is done sending gets no more.
            if self._closing:
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_timer()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            # h11 could not parse the head (or a later pipelined one): the same refusal, said in JSON.
            self._refuse("", 400, f"malformed HTTP request: {msg}")

        def _refuse(self, event: str, status: int, message: str) -> None:
            on_refusal(event, status, message)
            self._refuse_and_linger(_answer(status, message), limits.read_timeout_s)

        def _refuse_and_linger(self, answer: bytes, linger_s: float) -> None:
            self._closing = True
            self._cancel_timer()
            self.transport.write(answer)
            if self.transport.can_write_eof():
                self.transport.write_eof()
            # Whatever the client does, the connection is gone after the linger.
            self._timer = self.loop.call_later(linger_s, self.transport.abort)

        def _head_timed_out(self) -> None:
            self._timer = None
            if not self._head_done and not self.transport.is_closing():
                self.transport.close()

        def _cancel_timer(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    return GuardedH11Protocol
