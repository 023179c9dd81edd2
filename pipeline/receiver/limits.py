"""What one client may cost the webhook receiver, the ``Content-Length`` judgement every layer uses, and the
budget of body bytes held before a signature is checked."""

from __future__ import annotations

import threading
from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class ReceiverLimits:
    """What one client may cost the receiver. GitHub sends one delivery per connection, at most 25 MB.

    - ``max_body``: the largest ``Content-Length`` taken (``413`` over it, before the body is read).
    - ``max_connections``: connections open at once (``503`` with ``Retry-After`` over it).
    - ``read_timeout_s``: the time a connection has to send its request head, and then its whole body
      (closed without an answer, resp. ``408``).
    - ``ready_timeout_s``: the bound on each readiness check of ``GET /readyz``.
    - ``buffer_budget``: the body bytes all connections together may hold before their signature is checked
      (:class:`BodyBudget`; ``DURAFIX_RECEIVER_BUFFER_BYTES``). Without it 64 unsigned 25 MB bodies would be
      1.6 GB buffered by anyone who can reach the port.
    - ``small_body``: a body of at most this many bytes is always admitted (each connection slot keeps room
      for one), so a flood of large bodies never refuses GitHub's usual deliveries (a few KB to a few hundred).
    """

    max_body: int = 25 * MIB
    max_connections: int = 64
    read_timeout_s: float = 10.0
    ready_timeout_s: float = 3.0
    buffer_budget: int = 64 * MIB
    small_body: int = 256 * 1024


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


class BodyBudget:
    """The bytes of unverified bodies the receiver holds at once, across all connections.

    Contract: :meth:`reserve` is asked for a body's declared length before a byte of it is read, and
    :meth:`release` gives it back once the body's signature was checked (or the body was refused). The bytes
    held never exceed ``limits.buffer_budget``: of it, ``max_connections`` slots of ``small_body`` (each at
    most a ``1/max_connections`` share of the budget) are kept for small bodies, so one of at most that size is
    always admitted (the connection guard serves at most ``max_connections`` connections, each one request);
    a larger body takes from the rest and is refused (``False``) when that is spent. Thread-safe."""

    def __init__(self, limits: ReceiverLimits) -> None:
        self.small = max(0, min(limits.small_body, limits.buffer_budget // max(1, limits.max_connections)))
        self.small_pool = self.small * limits.max_connections
        self.large_pool = limits.buffer_budget - self.small_pool
        self._lock = threading.Lock()
        self._large = 0
        self._small = 0

    @property
    def held(self) -> int:
        """The bytes reserved now (small and large bodies)."""
        with self._lock:
            return self._large + self._small

    def reserve(self, length: int) -> bool:
        """Room for a body of ``length`` bytes, or ``False`` when holding it would exceed the budget."""
        with self._lock:
            if length <= self.small:
                # Under the connection guard this always fits; bounded anyway, for any server the app runs under.
                if self._small + length > self.small_pool:
                    return False
                self._small += length
                return True
            if self._large + length > self.large_pool:
                return False
            self._large += length
            return True

    def release(self, length: int) -> None:
        """Give back what :meth:`reserve` granted for ``length``."""
        with self._lock:
            if length <= self.small:
                self._small -= length
            else:
                self._large -= length
