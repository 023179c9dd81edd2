"""A real smart-HTTP git server (``git http-backend`` behind an HTTP server) that demands a token."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.gitrepo import Repo
from tests.support.served import QuietHandler

# The token the served repositories demand, in tests that check it never reaches the disk.
TOKEN = "ghs_token-that-must-never-touch-disk"


class GitHttpServer:
    """Serves the bare repositories under ``root`` at ``http://127.0.0.1:<port>/<name>.git``.

    Requests without ``Authorization: Basic base64(x-access-token:<token>)`` get 401.
    """

    def __init__(self, root: Path, token: str) -> None:
        self.root = root
        self.accept_token(token)
        self.authorized_requests = 0
        self.refused_requests = 0
        self.failed_requests = 0
        # (path substring, status or None to hang up, whether this entry lets the request through)
        self._failures: list[tuple[str, int | None, bool]] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        server = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                server._serve(self, b"")

            def do_POST(self) -> None:
                server._serve(self, _read_body(self))

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def accept_token(self, token: str) -> None:
        """From now on only ``token`` authenticates (the previous one is revoked)."""
        self.expected = "Basic " + base64.b64encode(f"x-access-token:{token}".encode()).decode()

    def fail_next(
        self, count: int, *, status: int | None = None, path: str = "/git-upload-pack", skip: int = 0
    ) -> None:
        """Fail ``count`` authorised requests whose path contains ``path``, after letting ``skip`` of them
        through: answer ``status`` with an empty body, or, when ``status`` is None, close the connection
        without any answer (curl's "Empty reply from server")."""
        with self._lock:
            self._failures += [(path, None, True)] * skip + [(path, status, False)] * count

    def _take_failure(self, path: str) -> tuple[bool, int | None]:
        with self._lock:
            for i, (needle, status, passes) in enumerate(self._failures):
                if needle in path:
                    del self._failures[i]
                    if passes:
                        return False, None
                    self.failed_requests += 1
                    return True, status
        return False, None

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def __enter__(self) -> GitHttpServer:
        """Serving until the block exits."""
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _serve(self, handler: QuietHandler, body: bytes) -> None:
        if handler.headers.get("Authorization") != self.expected:
            self.refused_requests += 1
            handler.answer(401, b"", ("WWW-Authenticate", 'Basic realm="git"'))
            return
        self.authorized_requests += 1
        parts = urlsplit(handler.path)
        self.paths.append(parts.path)
        failing, status = self._take_failure(parts.path)
        if failing:
            if status is None:
                handler.close_connection = True
                handler.connection.shutdown(socket.SHUT_RDWR)
                return
            handler.answer(status)
            return
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
        # http-backend exits non-zero when upload-pack refuses a request ("not our ref"), after writing the
        # refusal as its answer: that answer is what the client must get.
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, check=False).stdout
        head, sep, payload = out.partition(b"\r\n\r\n")
        if not sep:
            head, sep, payload = out.partition(b"\n\n")
        if not sep:
            handler.answer(500)
            return
        status = 200
        headers = []
        for line in head.decode().splitlines():
            name, _, value = line.partition(": ")
            if name.lower() == "status":
                status = int(value.split()[0])
            else:
                headers.append((name, value))
        handler.answer(status, payload, *headers)


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


@pytest.fixture
def server(repo: Repo) -> Iterator[GitHttpServer]:
    """The ``repo`` fixture's bare repository served over HTTP, demanding :data:`TOKEN`."""
    with GitHttpServer(repo.bare.parent, TOKEN) as srv:
        yield srv
