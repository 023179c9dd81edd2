"""The readiness probes against a real local HTTP server: any status answers, dead ports do not, proxies are
never used."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import httpx
import pytest

from environments.interface import ReadinessProbe
from environments.ports import free_port
from environments.readiness import answers, probe_once
from tests.support.served import QuietHandler, served

_STATUS_BY_PATH = {"/healthz": 200, "/missing": 404, "/broken": 500, "/moved": 302}
_PROXY_VARS = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


class _Handler(QuietHandler):
    def do_GET(self) -> None:
        status = _STATUS_BY_PATH.get(self.path, 404)
        body = f"status {status}\n".encode()
        if status == 302:
            # A redirect to a dead port: following it would turn an answer into a failure.
            dead = f"http://127.0.0.1:{self.server.dead_port}/"  # type: ignore[attr-defined]
            self.answer(status, body, ("Location", dead))
        else:
            self.answer(status, body)


@pytest.fixture
def dead_port() -> int:
    """A port nothing listens on (free just now)."""
    return free_port()


@pytest.fixture
def app(dead_port: int) -> Iterator[str]:
    """The base URL of a threaded HTTP server answering the statuses of ``_STATUS_BY_PATH``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.dead_port = dead_port  # type: ignore[attr-defined]
    with served(server):
        yield f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def dead_proxy(monkeypatch: pytest.MonkeyPatch) -> str:
    """Every proxy variable points at a port nothing listens on; exemptions are removed."""
    proxy = f"http://127.0.0.1:{free_port()}"
    for name in _PROXY_VARS:
        monkeypatch.setenv(name, proxy)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    return proxy


@pytest.mark.parametrize("path", ["/healthz", "/missing", "/broken", "/moved"])
def test_any_http_status_counts_as_answering(app: str, path: str) -> None:
    assert answers(app, path) is None


def test_a_trailing_slash_of_the_base_url_is_dropped(app: str) -> None:
    assert answers(app + "/", "/healthz") is None
    assert answers(app) is None


def test_a_closed_port_returns_why_it_does_not_answer(dead_port: int) -> None:
    reason = answers(f"http://127.0.0.1:{dead_port}", "/healthz", timeout_s=2.0)
    assert reason is not None and reason.startswith("ConnectError")


def test_a_server_that_accepts_but_never_replies_times_out_with_a_reason() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        reason = answers(f"http://127.0.0.1:{port}", "/", timeout_s=0.3)
    assert reason is not None and reason.startswith("ReadTimeout")


def test_proxy_variables_pointing_at_a_dead_port_are_ignored(app: str, dead_proxy: str) -> None:
    # The variables are in effect: the app is up, yet a client that trusts the environment cannot connect,
    # because it goes to the dead proxy instead.
    with pytest.raises(httpx.ConnectError), httpx.Client(trust_env=True, timeout=2.0) as trusting:
        trusting.get(app + "/healthz")

    assert answers(app, "/healthz") is None
    assert answers(app, "/broken") is None
    assert probe_once(app, ReadinessProbe(path="/healthz", expected_status=200))
    assert probe_once(app, ReadinessProbe(path="/missing", expected_status=404))
