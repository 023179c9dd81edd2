"""What one client may cost the webhook receiver, and the ``Content-Length`` judgement every layer uses."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReceiverLimits:
    """What one client may cost the receiver. GitHub sends one delivery per connection, at most 25 MB.

    - ``max_body``: the largest ``Content-Length`` taken (``413`` over it, before the body is read).
    - ``max_connections``: connections open at once (``503`` with ``Retry-After`` over it).
    - ``read_timeout_s``: the time a connection has to send its request head, and then its whole body
      (closed without an answer, resp. ``408``).
    - ``ready_timeout_s``: the bound on each readiness check of ``GET /readyz``.
    """

    max_body: int = 25 * 1024 * 1024
    max_connections: int = 64
    read_timeout_s: float = 10.0
    ready_timeout_s: float = 3.0


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
    # Compared as text first: a value of thousands of digits is over any limit and ``int()`` refuses it.
    if len(value.lstrip("0")) > len(str(max_body)) or int(value) > max_body:
        shown = value if len(value) <= 32 else value[:32] + "…"
        raise BodyRefused(413, f"payload too large: {shown} bytes declared, at most {max_body} taken")
    return int(value)
