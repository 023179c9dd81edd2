"""The model endpoint an external agent CLI is given: a proxy on the worker's loopback that holds the real key.

An agent CLI (``engine: command``) runs code the model wrote, so it must never hold the worker's model key,
and whatever it sends is hostile. It gets this proxy's URL and a key minted for one attempt instead; the proxy
checks that key, forwards each ``POST /v1/chat/completions`` to the configured endpoint with the real key and
the configured model (whatever model name the CLI sends), and charges the attempt the ``usage`` of every
answer. What the proxy guarantees:

- **One request in flight.** The proxy forwards one request at a time. A second request waits for the one
  in flight, at most ``wait_s`` (default: the upstream timeout), and is then refused with HTTP 429,
  ``type: request_in_flight`` (OpenAI's clients retry a 429). At most ``max_pending`` requests (default 32)
  are handled at once, the one in flight and those reading their body or waiting included; the next one is
  refused at once with 429 ``too_many_requests``. Nothing waits forever.
- **The budget is reserved before a request is forwarded.** The prompt is estimated at one token per 3
  bytes of the JSON body sent upstream, or at the densest ratio of real prompt tokens to body bytes that an
  earlier answer of this proxy showed, whichever is more. The request's ``max_tokens`` (and
  ``max_completion_tokens`` if present) is clamped so that estimate + ``n`` (default 1) x the limit fits in
  what is left of the budget; a request that sets neither gets ``max_tokens`` = what is left after the
  prompt, at most ``default_max_tokens`` (default 4,096, since an endpoint refuses a limit above its model's
  output limit). That amount is reserved; the answer's real ``usage`` is charged and the rest released. A
  request whose reservation cannot fit (less than one completion token per choice would be left) is refused
  with HTTP 429 and ``type: budget_exhausted``, its message saying how many tokens are left, and
  :attr:`ModelProxy.exhausted` is set so the caller stops the CLI.
- **What is charged when the answer does not say.** A 200 answer without a valid ``usage`` (or not JSON),
  and a request that was sent but never answered (timeout, dropped connection), are charged their whole
  reservation: the endpoint may have spent it. An error answer without ``usage``, and a request that never
  reached the endpoint, are charged nothing.
- **Bounds.** The completion tokens an endpoint that honours ``max_tokens`` can spend never exceed the
  budget. The prompt tokens are bounded by the estimate: a prompt denser than it (more than a token per 3
  bytes, e.g. text a tokenizer splits byte by byte) can make the charged total pass the budget by the
  difference on that one request; the excess is counted in :attr:`ModelProxy.overrun`, the next request is
  refused, and later estimates use the denser ratio.
- **Bodies are bounded.** A request needs a ``Content-Length`` (missing: 411; not one plain decimal number:
  400; ``Transfer-Encoding`` is refused with 411) of at most ``max_body_bytes`` (default 1 MiB), or it is
  refused with 413 before its body is read; the proxy reads exactly that many bytes, in bounded chunks, and
  never more. The key is checked before any body byte is read.

Streaming is refused (the usage of a stream is not reliably reported); anything other than chat completions
is 404. Every forwarded request carries the attempt's operation ID in ``X-Durafix-Op-Id``. Errors use
OpenAI's envelope (``{"error": {"message", "type", "code"}}``), so a CLI's OpenAI client shows the message.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import secrets
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import httpx

from repair.openai_calls import OP_ID_HEADER

_PATHS = ("/v1/chat/completions", "/chat/completions")
_BYTES_PER_TOKEN = 3
_LIMIT_KEYS = ("max_tokens", "max_completion_tokens")
_CONTENT_LENGTH = re.compile(r"[0-9]{1,15}")
_CHUNK = 64 * 1024
# After a 413 the unread body is drained (at most this much, for at most this long) before the socket is
# closed, so the client reads the refusal instead of a connection reset.
_DRAIN_BYTES = 8 * 1024 * 1024
_DRAIN_S = 5.0

Reply = tuple[int, dict[str, Any]]


class ModelProxy:
    """Context manager: serve on ``127.0.0.1:<port>`` until the block ends. Thread-safe counters.

    ``prompt_tokens`` / ``completion_tokens`` are what the attempt was charged, ``requests`` the requests
    forwarded (answered or not), ``reserved`` the reservation of the request in flight (0 when none is),
    ``overrun`` the tokens charged past their reservation (see the module).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        *,
        token_budget: int,
        op_id: str,
        timeout_s: float = 120.0,
        max_body_bytes: int = 1024 * 1024,
        wait_s: float | None = None,
        max_pending: int = 32,
        default_max_tokens: int = 4096,
    ) -> None:
        if max_body_bytes < 1 or max_pending < 1 or default_max_tokens < 1:
            raise ValueError("max_body_bytes, max_pending and default_max_tokens must be positive")
        self.upstream = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.token_budget = token_budget
        self.op_id = op_id
        self.max_body_bytes = max_body_bytes
        self.wait_s = timeout_s if wait_s is None else wait_s
        self.default_max_tokens = default_max_tokens
        self.key = "durafix-attempt-" + secrets.token_urlsafe(24)
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.requests = 0
        self.reserved = 0
        self.overrun = 0
        self.exhausted = threading.Event()
        self._api_key = api_key
        self._lock = threading.Lock()
        self._in_flight = threading.Lock()
        self._pending = threading.BoundedSemaphore(max_pending)
        self._density = 1.0 / _BYTES_PER_TOKEN
        self._http = httpx.Client(timeout=timeout_s)
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def spent(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __enter__(self) -> ModelProxy:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="model-proxy")
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._http.close()

    def admit(self) -> bool:
        """Take one of the ``max_pending`` places (without waiting); ``release`` gives it back."""
        return self._pending.acquire(blocking=False)

    def release(self) -> None:
        self._pending.release()

    def forward(self, body: dict[str, Any]) -> Reply:
        """One chat-completions request as the proxy answers it: ``(status, JSON body)``.

        Waits (at most ``wait_s``) for the request in flight, reserves the budget, forwards, charges.
        """
        if body.get("stream"):
            return 400, _error("streaming is not supported by this endpoint", "invalid_request_error")
        # An explicit null is how some clients say "not set".
        body = {k: v for k, v in body.items() if not (k in ("n", *_LIMIT_KEYS) and v is None)}
        invalid = _invalid_limits(body)
        if invalid:
            return 400, _error(invalid, "invalid_request_error")
        outgoing: dict[str, Any] = {k: v for k, v in body.items() if k not in _LIMIT_KEYS}
        outgoing["model"] = self.model
        try:
            size = len(_encode(outgoing))
        except UnicodeEncodeError:  # a lone surrogate escape (\ud800) parses as JSON but is no UTF-8
            return 400, _error("the request holds text that is not valid Unicode", "invalid_request_error")
        if not self._in_flight.acquire(timeout=max(0.0, self.wait_s)):
            message = (
                f"another request of this attempt has been in flight for over {self.wait_s:g} s; "
                "this endpoint serves one request at a time"
            )
            return 429, _error(message, "request_in_flight")
        try:
            return self._forward_alone(body, outgoing, size)
        finally:
            self._in_flight.release()

    def _forward_alone(self, body: dict[str, Any], outgoing: dict[str, Any], size: int) -> Reply:
        n = body.get("n", 1)
        with self._lock:
            left = self.token_budget - self.spent
            estimate = math.ceil(size * self._density)
            allowance = (left - estimate) // n
            if allowance < 1:
                self.exhausted.set()
                message = (
                    f"token budget exhausted: {max(0, left)} of {self.token_budget} tokens left, and this "
                    f"request needs more (its prompt is estimated at {estimate} tokens, plus at least one "
                    f"completion token per choice)"
                )
                return 429, _error(message, "budget_exhausted")
            limits = {k: min(body[k], allowance) for k in _LIMIT_KEYS if k in body}
            if not limits:
                limits = {"max_tokens": min(allowance, self.default_max_tokens)}
            reservation = estimate + n * max(limits.values())
            self.reserved = reservation
        outgoing.update(limits)
        charged = 0, 0
        try:
            reply, charged = self._send_upstream(outgoing, estimate, reservation)
        finally:
            self._charge(charged, reservation, size)
        return reply

    def _send_upstream(
        self, outgoing: dict[str, Any], estimate: int, reservation: int
    ) -> tuple[Reply, tuple[int, int]]:
        """The reply for the CLI, and the ``(prompt, completion)`` tokens to charge for it."""
        whole = estimate, reservation - estimate
        try:
            response = self._http.post(
                self.upstream,
                content=_encode(outgoing),
                headers={
                    "Authorization": f"Bearer {self._api_key}",
                    "Content-Type": "application/json",
                    OP_ID_HEADER: self.op_id,
                },
            )
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            return (502, _error(f"the model endpoint did not answer: {type(exc).__name__}", "upstream_error")), (0, 0)
        except httpx.HTTPError as exc:
            # Sent, and maybe answered upstream: what it cost is unknown, so it costs the reservation.
            reply = 502, _error(f"the model endpoint did not answer: {type(exc).__name__}", "upstream_error")
            return reply, whole
        ok = response.status_code == 200
        try:
            answer = response.json()
        except ValueError:
            reply = 502, _error(f"the model endpoint sent no JSON (HTTP {response.status_code})", "upstream_error")
            return reply, whole if ok else (0, 0)
        usage = _usage(answer.get("usage") if isinstance(answer, dict) else None)
        charged = usage if usage is not None else whole if ok else (0, 0)
        return (response.status_code, answer if isinstance(answer, dict) else {"answer": answer}), charged

    def _charge(self, charged: tuple[int, int], reservation: int, size: int) -> None:
        prompt, completion = charged
        with self._lock:
            self.reserved = 0
            self.requests += 1
            self.prompt_tokens += prompt
            self.completion_tokens += completion
            self.overrun += max(0, prompt + completion - reservation)
            if size and prompt:
                # A prompt denser than the estimate makes every later estimate at least as dense.
                self._density = max(self._density, prompt / size)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Connections beyond max_pending are answered (429), not left to overflow the listen queue.
    request_queue_size = 128


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _invalid_limits(body: dict[str, Any]) -> str:
    """Why ``n`` / ``max_tokens`` / ``max_completion_tokens`` cannot be honoured ("" when they can)."""
    for key in ("n", *_LIMIT_KEYS):
        if key in body and not _positive_int(body[key]):
            return f"{key!r} must be a positive integer"
    return ""


def _usage(usage: object) -> tuple[int, int] | None:
    """``(prompt, completion)`` from an answer's ``usage``, or None when it does not say both."""
    if not isinstance(usage, dict):
        return None
    counts = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
        return None
    return int(counts[0] or 0), int(counts[1] or 0)


def _error(message: str, type_: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "code": type_}}


def _handler(proxy: ModelProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # Each socket read waits at most this long, so a stalled client does not hold a place for ever.
        timeout = 60

        def do_POST(self) -> None:
            if not proxy.admit():
                message = "too many requests are pending at this endpoint; it serves one at a time"
                return self._refuse_unread(429, _error(message, "too_many_requests"))
            try:
                self._post()
            finally:
                proxy.release()

        def _post(self) -> None:
            if self.path.split("?")[0] not in _PATHS:
                return self._refuse_unread(404, _error(f"no such endpoint: {self.path}", "not_found"))
            if self.headers.get("Authorization") != f"Bearer {proxy.key}":
                return self._refuse_unread(401, _error("wrong key for this endpoint", "invalid_api_key"))
            raw = self._body()
            if raw is None:
                return
            try:
                body = json.loads(raw)
            except ValueError:
                return self._send(400, _error("the request is not JSON", "invalid_request_error"))
            if not isinstance(body, dict):
                return self._send(400, _error("the request is not a JSON object", "invalid_request_error"))
            self._send(*proxy.forward(body))

        def _body(self) -> bytes | None:
            """The body, or None when it was refused (the refusal is sent)."""
            if self.headers.get("Transfer-Encoding") is not None:
                self._refuse_unread(411, _error("send the body with a Content-Length", "invalid_request_error"))
                return None
            lengths = self.headers.get_all("Content-Length") or []
            if not lengths:
                self._refuse_unread(411, _error("a Content-Length is required", "invalid_request_error"))
                return None
            if len(lengths) != 1 or not _CONTENT_LENGTH.fullmatch(lengths[0].strip()):
                self._refuse_unread(400, _error("the Content-Length is not valid", "invalid_request_error"))
                return None
            length = int(lengths[0])
            if length > proxy.max_body_bytes:
                message = f"the request body of {length} bytes is over this endpoint's {proxy.max_body_bytes}"
                self._refuse_unread(413, _error(message, "request_too_large"))
                return None
            chunks: list[bytes] = []
            got = 0
            while got < length:
                chunk = self.rfile.read1(min(_CHUNK, length - got))
                if not chunk:
                    self._send(400, _error("the body ended before its Content-Length", "invalid_request_error"))
                    return None
                chunks.append(chunk)
                got += len(chunk)
            return b"".join(chunks)

        def _refuse_unread(self, status: int, payload: dict[str, Any]) -> None:
            """Answer without reading the body, then drain a bounded part of it so the client sees the answer."""
            self._send(status, payload)
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_WR)
                self.connection.settimeout(1.0)
                drained, until = 0, time.monotonic() + _DRAIN_S
                while drained < _DRAIN_BYTES and time.monotonic() < until:
                    chunk = self.connection.recv(_CHUNK)
                    if not chunk:
                        break
                    drained += len(chunk)

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            raw = json.dumps(payload).encode()
            with contextlib.suppress(OSError):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(raw)

        def log_message(self, format: str, *args: Any) -> None:
            return  # the worker's own log is not the place for every agent request

    return Handler
