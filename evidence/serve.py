"""A small read-only HTTP server over a local evidence store (``durafix evidence serve``).

Routes:

- ``GET /a/<key>``: the artifact's bytes with its media type. The object is hashed first and served only
  if it still matches the sha256 its key names (a tampered object gets 500, never its bytes). Responses
  are immutable (the key names the content) and carry ``nosniff`` and a Content-Security-Policy that lets
  an HTML report show ``data:`` images and inline styles but run nothing.
- ``GET /``: an index of the stored reports, newest first.
- ``GET /healthz``: ``ok``.

``HEAD`` works wherever ``GET`` does. Only keys of the store's own shape are accepted, so no request
reaches outside ``<root>/objects``.
"""

from __future__ import annotations

import argparse
import html
import shutil
import signal
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from urllib.parse import unquote, urlsplit

from evidence.interface import ArtifactKind, ArtifactMissingError
from evidence.keys import media_type_for, parse_key
from evidence.local import LocalArtifactStore
from evidence.streams import hash_file

_CSP = "default-src 'none'; img-src data: 'self'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


class EvidenceServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, store: LocalArtifactStore, host: str, port: int) -> None:
        self.store = store
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[0], self.server_address[1]
        return f"http://{host!s}:{port}"


class _Handler(BaseHTTPRequestHandler):
    server: EvidenceServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._respond(send_body=True)

    def do_HEAD(self) -> None:
        self._respond(send_body=False)

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"evidence-serve {self.address_string()} {format % args}\n")

    def _respond(self, *, send_body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        if path == "/healthz":
            self._send_text(HTTPStatus.OK, "ok\n", send_body)
        elif path == "/":
            self._send_index(send_body)
        elif path.startswith("/a/"):
            self._send_object(path.removeprefix("/a/"), send_body)
        else:
            self._send_text(HTTPStatus.NOT_FOUND, "not found\n", send_body)

    def _send_object(self, key: str, send_body: bool) -> None:
        store = self.server.store
        try:
            kind, expected_sha256 = parse_key(key)
            path = store.object_path(key)
            src = store.open_object(key)
        except ValueError:
            self._send_text(HTTPStatus.BAD_REQUEST, "malformed artifact key\n", send_body)
            return
        except ArtifactMissingError:
            self._send_text(HTTPStatus.NOT_FOUND, "no such artifact\n", send_body)
            return
        with src:
            sha256, size = hash_file(path)
            if sha256 != expected_sha256:
                self._send_text(HTTPStatus.INTERNAL_SERVER_ERROR, "artifact failed its integrity check\n", send_body)
                return
            meta = store.stored_meta(key) or {}
            media_type = str(meta.get("media_type") or media_type_for(kind, key, None))
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", media_type)
            self.send_header("Content-Length", str(size))
            self.send_header("Cache-Control", "public, max-age=31536000, immutable")
            self.send_header("ETag", f'"{sha256}"')
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Content-Security-Policy", _CSP)
            self.end_headers()
            if send_body:
                shutil.copyfileobj(src, self.wfile)

    def _send_index(self, send_body: bool) -> None:
        store = self.server.store
        entries = []
        for key in store.keys(ArtifactKind.REPORT):
            meta = store.stored_meta(key) or {}
            entries.append((str(meta.get("created_at", "")), key))
        entries.sort(reverse=True)
        items = "".join(
            f'<li><a href="/a/{html.escape(key)}">{html.escape(created or key)}</a> '
            f"<code>{parse_key(key)[1][:16]}</code></li>"
            for created, key in entries
        )
        page = (
            '<!doctype html><html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">'
            "<title>durafix evidence</title></head><body><h1>Evidence reports</h1>"
            f"<ul>{items or '<li>none yet</li>'}</ul></body></html>\n"
        )
        self._send_text(HTTPStatus.OK, page, send_body, media_type="text/html; charset=utf-8")

    def _send_text(
        self, status: HTTPStatus, text: str, send_body: bool, media_type: str = "text/plain; charset=utf-8"
    ) -> None:
        data = text.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", media_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", _CSP)
        self.end_headers()
        if send_body:
            self.wfile.write(data)


def make_server(store_root: Path, host: str = "127.0.0.1", port: int = 0) -> EvidenceServer:
    """A bound server over ``store_root`` (port 0 picks a free port); run it with ``serve_forever``."""
    return EvidenceServer(LocalArtifactStore(store_root), host, port)


def serve(store_root: Path, host: str = "127.0.0.1", port: int = 0) -> None:
    """Serve until SIGINT or SIGTERM; prints the base URL on stdout once listening."""
    server = make_server(store_root, host, port)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    thread = threading.Thread(target=server.serve_forever, name="evidence-serve", daemon=True)
    thread.start()
    try:
        print(server.url, flush=True)
        stop.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        server.shutdown()
        server.server_close()
        thread.join()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", required=True, type=Path, help="the local evidence store's directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evidence.serve", description="Serve a local evidence store over HTTP."
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    serve(args.root, args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
