"""Heartbeating around blocking work in synchronous activities.

A long activity heartbeats so that (a) a dead worker is noticed after the heartbeat timeout instead of the
whole start-to-close timeout, and (b) cancellation reaches it: a heartbeat is how a sync activity learns it
was cancelled. :class:`Heartbeat` beats from a helper thread while the activity thread blocks in a call that
cannot beat itself (a setup command, a readiness wait, a model call), carrying the sub-state of the work in
its details, with the seconds spent in it: ``setup: npm ci (41 s)``. ``durafix status`` shows it.

A block without a carry sends its first beat once it has lasted ``every_s``: most steps (a forge call, a model
turn) end well within a second, and a beat at their entry was one more heartbeat RPC and history-store write
per step, for a sub-state nobody could have read before the step ended. Nothing of the heartbeat's guarantees
rests on that first beat: the server's heartbeat timeout counts from the attempt's start, and a cancellation
reaches a longer step at its first beat, a second in, as it did at the one after. A block with a carry beats at
its entry, so that a retry of an attempt that fails at once still finds the carry. A new sub-state
(:meth:`Heartbeat.set`) is beaten at once as before.

Every beat of a block, the first and each new sub-state's among them, is sent by that helper thread, never by
the activity's own: the SDK hands a sync activity's heartbeat to the worker's event loop and blocks the caller
until the loop has taken it, a wait that would hold up the activity's work at every beat. The block's end waits
until the helper has sent any beat still owed, so the last sub-state and carry are handed over before the
activity returns or fails; a beat outside any block (a :meth:`Heartbeat.set` after it ended) is sent by the
caller.

Details are the sub-state text, or ``{"detail": text, **carry}`` when the activity carries facts to its next
attempt: Temporal hands the last heartbeat's details of a failed attempt to the retry
(``activity.info().heartbeat_details``), also when that heartbeat was sent just before the failure.

A :class:`Heartbeat` entered inside another (an activity wrapped by :func:`heartbeating` that beats a finer
sub-state of its own) silences the outer one while it lasts: the details are always the innermost sub-state,
and an inner block's carry is never overwritten by the outer text.

How often beats reach the server is the worker's throttle (``max_heartbeat_throttle_interval`` in
:mod:`pipeline.worker.runner`), well inside every heartbeat timeout of :class:`pipeline.policies.RunPolicy`.
"""

from __future__ import annotations

import contextvars
import functools
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, TypeVar

from temporalio import activity
from temporalio.activity import _Definition

F = TypeVar("F", bound=Callable[..., Any])

BEAT_EVERY_S = 1.0
"""How often a block beats by default. A cancellation reaches an activity in the server's answer to a beat, so
this (with the worker's throttle, ``HEARTBEAT_THROTTLE`` in :mod:`pipeline.worker.runner`) bounds how long a
cancelled activity runs on before it learns of it."""

# The innermost Heartbeat entered in this activity's thread (helper threads run in copies of its context).
_CURRENT: contextvars.ContextVar[Heartbeat | None] = contextvars.ContextVar("durafix_heartbeat", default=None)


class Heartbeat:
    """Context manager: heartbeat the current sub-state every ``every_s`` seconds until the block ends, the
    first beat ``every_s`` after its entry unless it carries facts (then at once: see the module)."""

    def __init__(self, detail: str, every_s: float = BEAT_EVERY_S, carry: Mapping[str, object] | None = None) -> None:
        self.detail = detail
        self.every_s = every_s
        self.carry = dict(carry or {})
        self._since = time.monotonic()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        # A beat is owed to the helper thread (_due), and set while none is owed or being sent (_sent); the lock
        # keeps the two in step between the threads that owe beats and the helper that sends them.
        self._lock = threading.Lock()
        self._due = False
        self._sent = threading.Event()
        self._sent.set()
        self._outer: Heartbeat | None = None
        self._token: contextvars.Token[Heartbeat | None] | None = None
        # Set while a Heartbeat entered inside this one lasts: this one keeps quiet.
        self._inner: Heartbeat | None = None

    def set(self, detail: str) -> None:
        """Enter a new sub-state (its clock starts now) and beat at once: inside the block the helper thread
        sends the beat (the caller does not wait for it), outside it the caller. Safe to call from any thread."""
        self.detail = detail
        self._since = time.monotonic()
        self._owe()

    def _owe(self) -> None:
        if self._thread is None:
            self.beat()
            return
        with self._lock:
            self._due = True
            self._sent.clear()
        self._wake.set()

    def text(self) -> str:
        return f"{self.detail} ({time.monotonic() - self._since:.0f} s)"

    def beat(self) -> None:
        if self._inner is not None:
            return
        text = self.text()
        activity.heartbeat({"detail": text, **self.carry} if self.carry else text)

    def __enter__(self) -> Heartbeat:
        self._since = time.monotonic()
        self._outer = _CURRENT.get()
        if self._outer is not None:
            # What the outer block still owes goes out before this block takes the details over.
            self._outer._sent.wait(timeout=5)
            self._outer._inner = self
        self._token = _CURRENT.set(self)
        ctx = contextvars.copy_context()
        self._thread = threading.Thread(target=ctx.run, args=(self._beat,), daemon=True, name="heartbeat")
        if self.carry:
            # A carry reaches the next attempt only in a beat: owed at once, so an attempt failing at once hands it on.
            self._owe()
        self._thread.start()
        return self

    def _beat(self) -> None:
        """The helper thread: send each beat owed, and one every ``every_s`` seconds, until the block ends."""
        while True:
            with self._lock:
                due, self._due = self._due, False
            if due:
                self.beat()
            with self._lock:
                if not self._due:
                    self._sent.set()
            if self._stop.is_set():
                return
            if not self._wake.wait(self.every_s):
                with self._lock:
                    self._due = True
                    self._sent.clear()
            self._wake.clear()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._token is not None:
            _CURRENT.reset(self._token)
            self._token = None
        if self._outer is not None:
            self._outer._inner = None
            self._outer = None


def heartbeating(fn: F, detail: str | None = None, every_s: float = BEAT_EVERY_S) -> F:
    """``fn``, a synchronous activity, as an activity of the same name that heartbeats while it runs.

    For activities with no heartbeat of their own (the forge's): registered through this, an attempt's
    heartbeat timeout applies to them, so a worker that dies is noticed after that timeout rather than the
    whole start-to-close timeout. Cancellation is not raised into the activity's thread by these heartbeats
    (``no_thread_cancel_exception``): a forge call runs to its end as it did before it beat, and its ensure
    semantics make whatever it did reconcilable. An inner :class:`Heartbeat` of ``fn`` takes the details over
    while it lasts.
    """
    defn = _definition_name(fn)
    text = detail or defn

    @functools.wraps(fn)
    def beating(*args: Any, **kwargs: Any) -> Any:
        with Heartbeat(text, every_s=every_s):
            return fn(*args, **kwargs)

    # functools.wraps copied fn's attributes, its activity definition among them; the wrapper gets its own.
    beating.__dict__.pop("__temporal_activity_definition", None)
    wrapped: F = activity.defn(name=defn, no_thread_cancel_exception=True)(beating)  # type: ignore[assignment]
    return wrapped


def _definition_name(fn: Callable[..., Any]) -> str:
    found = _Definition.from_callable(fn)
    if found is None or found.name is None:
        raise TypeError(f"{fn!r} is not an activity (no @activity.defn)")
    return found.name
