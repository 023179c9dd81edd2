"""Fixtures for the forge's tests: a running forge, users with tokens, PyGithub clients, a webhook receiver."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from infra.forge.pytest_plugin import forge
from infra.forge.testing import ForgeHandle

from .helpers import Received, Receiver, Team

__all__ = ["forge"]


@pytest.fixture
def team(forge: ForgeHandle) -> Team:
    alice = forge.create_user("alice")
    bob = forge.create_user("bob")
    carol = forge.create_user("carol")
    forge.create_repo(alice, "shop")
    forge.add_collaborator(alice, "alice/shop", "bob", "push")
    return Team(forge, alice, bob, carol)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            rec = state["r"]
            with rec.lock:
                rec.received.append(Received(self.path, dict(self.headers.items()), body))
            reply = b'{"ok": true}'
            self.send_response(rec.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state["r"] = Receiver(f"http://127.0.0.1:{server.server_address[1]}/hook")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state["r"]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
