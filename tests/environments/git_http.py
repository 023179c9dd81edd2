"""A real smart-HTTP git server (``git http-backend`` behind an HTTP server) that demands a token."""

from __future__ import annotations

import base64
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit


class GitHttpServer:
    """Serves the bare repositories under ``root`` at ``http://127.0.0.1:<port>/<name>.git``.

    Requests without ``Authorization: Basic base64(x-access-token:<token>)`` get 401.
    """

    def __init__(self, root: Path, token: str) -> None:
        self.root = root
        self.expected = "Basic " + base64.b64encode(f"x-access-token:{token}".encode()).decode()
        self.authorized_requests = 0
        self.refused_requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server._serve(self, b"")

            def do_POST(self) -> None:
                server._serve(self, _read_body(self))

            def log_message(self, format: str, *args: object) -> None:
                """Silent: per-request lines would drown the test output."""

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def _serve(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        if handler.headers.get("Authorization") != self.expected:
            self.refused_requests += 1
            handler.send_response(401)
            handler.send_header("WWW-Authenticate", 'Basic realm="git"')
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        self.authorized_requests += 1
        parts = urlsplit(handler.path)
        env = {
            "PATH": os.environ["PATH"],
            "GIT_PROJECT_ROOT": str(self.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "REQUEST_METHOD": handler.command,
            "PATH_INFO": parts.path,
            "QUERY_STRING": parts.query,
            "CONTENT_TYPE": handler.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "HTTP_CONTENT_ENCODING": handler.headers.get("Content-Encoding", ""),
            "GIT_PROTOCOL": handler.headers.get("Git-Protocol", ""),
            "REMOTE_ADDR": "127.0.0.1",
        }
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, check=True).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        status = 200
        headers = []
        for line in head.decode().split("\r\n"):
            name, _, value = line.partition(": ")
            if name.lower() == "status":
                status = int(value.split()[0])
            else:
                headers.append((name, value))
        handler.send_response(status)
        for name, value in headers:
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks: list[bytes] = []
        while True:
            size = int(handler.rfile.readline().strip(), 16)
            chunk = handler.rfile.read(size)
            handler.rfile.readline()
            if size == 0:
                return b"".join(chunks)
            chunks.append(chunk)
    return handler.rfile.read(int(handler.headers.get("Content-Length", "0")))
