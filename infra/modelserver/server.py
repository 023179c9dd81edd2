"""A scripted OpenAI-compatible HTTP server: the model durafix talks to in tests and the demo.

Endpoints:

- ``POST /v1/chat/completions``: answers from the script (see :mod:`infra.modelserver.script`) in OpenAI's
  response shape. Errors use OpenAI's envelope: 401 without ``Authorization: Bearer <token>`` (or with a
  token other than the script's ``api_key``), 404 for a model the script does not serve, 400 for a request
  no conversation matches or that has outrun its conversation, and whatever a pending fault says.
- ``GET /v1/models``: the one model the script serves.
- ``GET /_admin/requests``: every ``/v1`` request so far (see :mod:`infra.modelserver.request_log`).
- ``POST /_admin/faults`` / ``GET /_admin/faults``: queue a fault / list pending ones
  (see :mod:`infra.modelserver.faults`).

Answers are deterministic: the same request gets the same message, tool calls, IDs and token counts. The
admin endpoints are unauthenticated; bind the server to loopback.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import ValidationError

from infra.modelserver import completions
from infra.modelserver.faults import Fault, FaultQueue
from infra.modelserver.request_log import RequestLog
from infra.modelserver.script import Script, load_script


class _Reply:
    """What the handler sends back, and what the request log remembers about it."""

    def __init__(self, status: int, body: object, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = headers or {}
        self.note: dict[str, Any] = {}


class _HTTPServer(ThreadingHTTPServer):
    # Handler threads are joined on close, so once stop() returns every request is answered and recorded.
    daemon_threads = False
    block_on_close = True

    def __init__(self, address: tuple[str, int], script: Script, log: RequestLog) -> None:
        super().__init__(address, _Handler)
        self.script = script
        self.log = log
        self.faults = FaultQueue()
        # Set on stop, so a request held by a delay fault is released instead of outliving the server.
        self.stopping = threading.Event()


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._api(lambda _raw: self._models())
        elif self.path == "/_admin/requests":
            self._send(_Reply(200, self.server.log.read()))
        elif self.path == "/_admin/faults":
            self._send(_Reply(200, [f.model_dump(exclude_none=True) for f in self.server.faults.pending()]))
        else:
            self._send(_Reply(404, completions.error_body(f"no route {self.path}", "invalid_request_error")))

    def do_POST(self) -> None:
        if self.path == "/v1/chat/completions":
            self._api(self._chat)
        elif self.path == "/_admin/faults":
            self._send(self._add_fault(self._body()))
        else:
            self._send(_Reply(404, completions.error_body(f"no route {self.path}", "invalid_request_error")))

    def log_message(self, format: str, *args: Any) -> None:
        # Every API request is in the request log; a line per request on stderr would only repeat it.
        return

    # ---- API requests: authenticated and recorded ----------------------------------------------------

    def _api(self, answer: Callable[[bytes], _Reply]) -> None:
        raw = self._body()
        reply = self._unauthorized() or answer(raw)
        headers = {k.lower(): v for k, v in self.headers.items() if k.lower() != "authorization"}
        try:
            body: object = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", errors="replace")
        self.server.log.append(
            {"method": self.command, "path": self.path, "status": reply.status, "headers": headers, "body": body}
            | reply.note
        )
        self._send(reply)

    def _unauthorized(self) -> _Reply | None:
        auth = self.headers.get("Authorization", "")
        token = auth[len("Bearer ") :].strip() if auth.startswith("Bearer ") else ""
        expected = self.server.script.api_key
        if token and (expected is None or token == expected):
            return None
        message = "missing bearer token" if not token else "incorrect API key"
        return _Reply(401, completions.error_body(message, "invalid_request_error", "invalid_api_key"))

    def _models(self) -> _Reply:
        model = {"id": self.server.script.model, "object": "model", "created": 0, "owned_by": "durafix"}
        return _Reply(200, {"object": "list", "data": [model]})

    def _chat(self, raw: bytes) -> _Reply:
        fault = self.server.faults.take()
        if fault is None:
            return self._scripted(raw)
        if fault.status is not None:
            reply = self._fault_reply(fault.status, fault.retry_after)
        else:
            self.server.stopping.wait(fault.delay_s)
            reply = self._scripted(raw)
        reply.note["fault"] = fault.model_dump(exclude_none=True)
        return reply

    @staticmethod
    def _fault_reply(status: int, retry_after: float | None) -> _Reply:
        headers = {} if retry_after is None else {"Retry-After": f"{retry_after:g}"}
        if status == 429:
            body = completions.error_body("rate limit reached (injected)", "requests", "rate_limit_exceeded")
        else:
            body = completions.error_body(f"injected fault {status}", "server_error")
        return _Reply(status, body, headers)

    def _scripted(self, raw: bytes) -> _Reply:
        script = self.server.script
        try:
            request = json.loads(raw)
        except ValueError:
            return _Reply(400, completions.error_body("request body is not JSON", "invalid_request_error"))
        messages = request.get("messages") if isinstance(request, dict) else None
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return _Reply(400, completions.error_body("'messages' must be a list of objects", "invalid_request_error"))
        if request.get("stream"):
            return _Reply(400, completions.error_body("streaming is not supported", "invalid_request_error"))
        if request.get("model") != script.model:
            message = f"model {request.get('model')!r} does not exist; this server serves {script.model!r}"
            return _Reply(404, completions.error_body(message, "invalid_request_error", "model_not_found"))

        system = completions.first_text(messages, "system")
        user = completions.first_text(messages, "user")
        conversation = script.find(system, user)
        if conversation is None:
            message = (
                "no conversation in the script matches this request "
                f"(system prompt starts {system[:120]!r}; first user message starts {user[:120]!r})"
            )
            return _Reply(400, completions.error_body(message, "invalid_request_error", "script_unmatched"))
        turn = completions.assistant_turns(messages)
        if turn >= len(conversation.turns):
            message = (
                f"conversation {conversation.name!r} has {len(conversation.turns)} turns; "
                f"this request already holds {turn} assistant messages"
            )
            reply = _Reply(400, completions.error_body(message, "invalid_request_error", "script_exhausted"))
        else:
            body = completions.completion_body(
                script.model,
                conversation.turns[turn],
                turn,
                completions.digest(raw),
                completions.prompt_tokens(messages),
                completions.answer_limit(request),
            )
            reply = _Reply(200, body)
        reply.note = {"conversation": conversation.name, "turn": turn}
        if isinstance(reply.body, dict) and "usage" in reply.body:
            # What the answer charged, so a test can add up what a client was billed.
            reply.note["usage"] = reply.body["usage"]
        return reply

    # ---- admin ---------------------------------------------------------------------------------------

    def _add_fault(self, raw: bytes) -> _Reply:
        try:
            fault = Fault.model_validate_json(raw)
        except ValidationError as e:
            return _Reply(400, completions.error_body(str(e), "invalid_request_error"))
        self.server.faults.add(fault)
        return _Reply(201, [f.model_dump(exclude_none=True) for f in self.server.faults.pending()])

    # ---- transport -----------------------------------------------------------------------------------

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, reply: _Reply) -> None:
        data = json.dumps(reply.body, ensure_ascii=False).encode("utf-8")
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (e.g. it timed out during a delay fault); the request is already recorded.
            return


class ScriptedModelServer:
    """Serves ``script_path`` on ``host:port`` (0 picks a free port) and records requests in ``data_dir``.

    ``start()`` loads and validates the script (``ValueError`` when it is invalid) and returns once the
    socket is listening; ``stop()`` releases held requests, stops serving and closes the socket.
    """

    def __init__(self, script_path: Path, data_dir: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.script_path = script_path
        self.data_dir = data_dir
        self.host = host
        self.port = port
        self._server: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def root_url(self) -> str:
        """``http://host:port``: the admin endpoints live under it."""
        if self._server is None:
            raise RuntimeError("the server is not started")
        return f"http://{self.host}:{self._server.server_address[1]}"

    @property
    def base_url(self) -> str:
        """What an OpenAI client takes as its base URL (ends in ``/v1``)."""
        return f"{self.root_url}/v1"

    def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("the server is already started")
        script = load_script(self.script_path)
        self._server = _HTTPServer((self.host, self.port), script, RequestLog(self.data_dir))
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="scripted-model", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = None
        self._thread = None

    def __enter__(self) -> ScriptedModelServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
