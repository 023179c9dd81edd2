"""The model endpoint an external agent CLI is given: a proxy on the worker's loopback that holds the real key.

An agent CLI (``engine: command``) runs code the model wrote, so it must never hold the worker's model key.
It gets this proxy's URL and a key minted for one attempt instead; the proxy checks that key, forwards each
``POST /v1/chat/completions`` to the configured endpoint with the real key and the configured model (whatever
model name the CLI sends), and adds up the ``usage`` of every answer. That count is what the attempt is
charged, and the proxy refuses requests (HTTP 429 with ``type: budget_exhausted``) once the attempt's token
budget is spent, so a CLI cannot spend past it; the caller sees :attr:`ModelProxy.exhausted` and stops it.

Streaming is refused (the usage of a stream is not reliably reported); anything other than chat completions
is 404. Every forwarded request carries the attempt's operation ID in ``X-Durafix-Op-Id``.
"""

from __future__ import annotations

import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import httpx

from repair.openai_calls import OP_ID_HEADER

_PATHS = ("/v1/chat/completions", "/chat/completions")


class ModelProxy:
    """Context manager: serve on ``127.0.0.1:<port>`` until the block ends. Thread-safe counters."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        *,
        token_budget: int,
        op_id: str,
        timeout_s: float = 120.0,
    ) -> None:
        self.upstream = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.token_budget = token_budget
        self.op_id = op_id
        self.key = "durafix-attempt-" + secrets.token_urlsafe(24)
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.requests = 0
        self.exhausted = threading.Event()
        self._api_key = api_key
        self._lock = threading.Lock()
        self._http = httpx.Client(timeout=timeout_s)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
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

    def forward(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """One chat-completions request as the proxy answers it: ``(status, JSON body)``."""
        if body.get("stream"):
            return 400, _error("streaming is not supported by this endpoint", "invalid_request_error")
        if self.spent >= self.token_budget:
            self.exhausted.set()
            return 429, _error(f"token budget of {self.token_budget} spent", "budget_exhausted")
        body = {**body, "model": self.model}
        try:
            response = self._http.post(
                self.upstream,
                json=body,
                headers={"Authorization": f"Bearer {self._api_key}", OP_ID_HEADER: self.op_id},
            )
        except httpx.HTTPError as exc:
            return 502, _error(f"the model endpoint did not answer: {type(exc).__name__}", "upstream_error")
        try:
            answer = response.json()
        except ValueError:
            return 502, _error(f"the model endpoint sent no JSON (HTTP {response.status_code})", "upstream_error")
        usage = answer.get("usage") if isinstance(answer, dict) else None
        if isinstance(usage, dict):
            with self._lock:
                self.requests += 1
                self.prompt_tokens += int(usage.get("prompt_tokens") or 0)
                self.completion_tokens += int(usage.get("completion_tokens") or 0)
        return response.status_code, answer if isinstance(answer, dict) else {"answer": answer}


def _error(message: str, type_: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "code": type_}}


def _handler(proxy: ModelProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path.split("?")[0] not in _PATHS:
                return self._send(404, _error(f"no such endpoint: {self.path}", "not_found"))
            if self.headers.get("Authorization") != f"Bearer {proxy.key}":
                return self._send(401, _error("wrong key for this endpoint", "invalid_api_key"))
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            except ValueError:
                return self._send(400, _error("the request is not JSON", "invalid_request_error"))
            if not isinstance(body, dict):
                return self._send(400, _error("the request is not a JSON object", "invalid_request_error"))
            self._send(*proxy.forward(body))

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            raw = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, format: str, *args: Any) -> None:
            return  # the worker's own log is not the place for every agent request

    return Handler
