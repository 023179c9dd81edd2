"""The HTTP server under ``durafix serve``: the receiver's ASGI app under uvicorn, on a socket bound at once.

Contract:
- The listening socket is bound when the server is made, so ``address`` (and the receiver's URL) is known
  before it serves, and port 0 picks a free port.
- ``start()`` serves on a thread of its own and returns once uvicorn is listening; ``serve_forever()`` serves
  on the calling thread until ``stop()`` or, on the main thread, SIGINT/SIGTERM (uvicorn captures them and
  re-raises them after shutting down, so ``KeyboardInterrupt`` still reaches the caller). ``stop()`` is
  idempotent; connections still open are given ``SHUTDOWN_GRACE_S`` and then dropped.
- uvicorn runs with its pure-Python parts only (asyncio loop, h11 wrapped by
  :mod:`pipeline.receiver.protocol`, no websockets, no lifespan, no logging config of its own, no access log:
  the app logs one JSON line per delivery). The limits are :class:`ReceiverLimits`, enforced by the guard
  (connections, request head, ``Content-Length``) and the app (body deadline, signature, dispatch).
"""

from __future__ import annotations

import asyncio
import socket
import threading

import uvicorn
from starlette.types import ASGIApp

from pipeline.receiver.limits import BodyRefused, ReceiverLimits, body_length
from pipeline.receiver.protocol import Refusal, guarded_protocol

__all__ = ["BodyRefused", "ReceiverLimits", "ReceiverServer", "body_length"]

SHUTDOWN_GRACE_S = 5.0
STARTUP_TIMEOUT_S = 30.0


class _Server(uvicorn.Server):
    """A uvicorn server that says when it listens (or gave up starting)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets)
        finally:
            self.listening.set()


class ReceiverServer:
    """``app`` served by uvicorn on ``host:port`` under ``limits``; refusals of the connection guard go to
    ``on_refusal``."""

    def __init__(self, app: ASGIApp, host: str, port: int, limits: ReceiverLimits, on_refusal: Refusal) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
            # A burst of deliveries must reach the guard, which answers 503 over the cap, not the kernel's backlog.
            self._sock.listen(128)
        except OSError:
            self._sock.close()
            raise
        self._sock.setblocking(False)
        config = uvicorn.Config(
            app,
            http=guarded_protocol(limits, on_refusal),
            loop="asyncio",
            ws="none",
            lifespan="off",
            interface="asgi3",
            log_config=None,
            access_log=False,
            server_header=False,
            timeout_keep_alive=max(1, int(limits.read_timeout_s)),
            timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S),
            backlog=128,
        )
        self._server = _Server(config)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    def start(self) -> None:
        """Serve on a daemon thread; return once listening (``RuntimeError`` if uvicorn could not start)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._serve_in_thread, name="webhook-http", daemon=True)
        self._thread.start()
        if not self._server.listening.wait(STARTUP_TIMEOUT_S) or not self._server.started:
            raise RuntimeError(f"the webhook receiver did not start listening on {self.address}")

    def _serve_in_thread(self) -> None:
        # Not ``Server.run``: a second thread must not touch the process's signal handlers.
        asyncio.run(self._server.serve(sockets=[self._sock]))

    def serve_forever(self) -> None:
        """Serve on the calling thread until :meth:`stop` (from another thread) or a signal."""
        self._server.run(sockets=[self._sock])

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(SHUTDOWN_GRACE_S + 5)
        self._sock.close()
