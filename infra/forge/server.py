"""The forge's HTTP server: stdlib ``ThreadingHTTPServer``, one thread per connection, HTTP/1.1 keep-alive.

Owning the socket is what lets fault injection drop a connection after a request was applied. Routing:
``/api/v3/...`` and ``/api/graphql`` go to the API, ``/OWNER/REPO.git/...`` to git smart HTTP, anything else
is 404. Request bodies over the limit (25 MB for the API, 2 GB for git, on the wire or decoded) are refused with
413, bodies in an unknown content coding with 415 (before they are read), undecodable ones with 400.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, cast

from .app import API_PREFIX, GRAPHQL_PATH, Dropped, Forge
from .faults import error_before_apply
from .githttp import handle_git, is_git_path
from .wire import DECODABLE, ApiError, BodyTooLarge, Request, Response, UndecodableBody, UnsupportedEncoding, read_body

API_BODY_LIMIT = 25 * 1024 * 1024
GIT_BODY_LIMIT = 2 * 1024 * 1024 * 1024


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    forge: Forge

    def version_string(self) -> str:
        return "GitHub.com"

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes; without this, Nagle + delayed ACK add ~40 ms each.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: object) -> None:
        # Per-request logs would drown test output; failures surface as HTTP answers.
        return

    def _handle(self) -> None:
        split = urllib.parse.urlsplit(self.path)
        path = split.path
        is_api = path.startswith(API_PREFIX + "/") or path in (API_PREFIX, GRAPHQL_PATH)
        git = not is_api and is_git_path(path)
        limit = GIT_BODY_LIMIT if git else API_BODY_LIMIT
        try:
            body, size = read_body(cast(IO[bytes], self.rfile), self.headers, limit)
        except BodyTooLarge:
            self.close_connection = True
            self._send(Response.json(413, ApiError(413, "Request body too large").body()))
            return
        except UnsupportedEncoding as exc:
            # RFC 9110: a 415 for a content coding names the codings that would have been accepted.
            self.close_connection = True
            refusal = ApiError(415, f"Unsupported Content-Encoding: {exc.coding}")
            self._send(Response.json(415, refusal.body(), [("Accept-Encoding", ", ".join(DECODABLE))]))
            return
        except UndecodableBody as exc:
            self.close_connection = True
            self._send(Response.json(400, ApiError(400, f"Problems decoding the request body: {exc}").body()))
            return
        except (ConnectionError, ValueError, OSError):
            self.close_connection = True
            return
        req = Request(
            self.command,
            path,
            urllib.parse.parse_qs(split.query, keep_blank_values=True),
            self.headers,
            body,
            size,
            self.client_address[0],
        )
        try:
            if is_api:
                result = self.forge.handle_api(req)
            elif git:
                result = self._git(req)
            else:
                result = Response.json(404, ApiError(404, "Not Found").body())
        finally:
            body.close()
        if isinstance(result, Dropped):
            self._drop()
            return
        self._send(result)

    def _git(self, req: Request) -> Response | Dropped:
        fault = self.forge.faults.take(req.method, req.path)
        if fault is not None:
            err = error_before_apply(fault, "git", None)
            if err is not None:
                return Response(
                    err.status,
                    json.dumps(err.body()).encode(),
                    [("Content-Type", "application/json"), *err.headers.items()],
                )
        response = handle_git(self.forge, req)
        if fault is not None and fault.action == "drop_after_apply":
            return Dropped()
        return response

    def _drop(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _send(self, response: Response) -> None:
        try:
            self.send_response(response.status)
            for name, value in response.headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(response.body)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (a timeout, say); what it asked for is committed all the same.
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle


class _Listener(ThreadingHTTPServer):
    # The stdlib's backlog is 5: a loaded host with a receiver, workers and tests all connecting at once can
    # fill it, and a connection that then waits for accept() is what a client sees reset.
    request_queue_size = 128


class ForgeServer:
    """A GitHub-compatible server on ``host:port`` (0 picks a free port), state under ``data_dir``."""

    def __init__(self, data_dir: Path, host: str = "127.0.0.1", port: int = 0, *, admin_token: str) -> None:
        self._forge = Forge(Path(data_dir), admin_token)
        handler = type("ForgeHandler", (_Handler,), {"forge": self._forge})
        self._httpd = _Listener((host, port), handler)
        self._httpd.daemon_threads = True
        self._host = host
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def api_url(self) -> str:
        return self.base_url + API_PREFIX

    @property
    def forge(self) -> Forge:
        return self._forge

    def start(self) -> None:
        self._forge.start(self.base_url)
        # A short poll interval keeps stop() quick; serving is not affected by it.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="forge-http", daemon=True
        )
        self._thread.start()

    def serve_forever(self) -> None:
        """Serve on the calling thread until :meth:`shutdown` is called from another thread."""
        self._forge.start(self.base_url)
        self._httpd.serve_forever()

    def shutdown(self) -> None:
        self._httpd.shutdown()

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()
        self._forge.stop()
