"""Real web apps for the browser tests: the sample cart app in a subprocess (as shipped, or fixed in a copy)
and a tiny in-process server whose page alternates between two answers."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path

from environments.ports import free_port
from tests.support.served import QuietHandler, served

CART_DIR = Path(__file__).resolve().parents[2] / "examples" / "cart"
BUGGY_TOTAL = "return sum(item.unit_price_cents for item in items)"
FIXED_TOTAL = "return sum(line_total(item) for item in items)"


def fixed_cart_copy(dest: Path) -> Path:
    """A copy of the cart app whose total counts quantities."""
    shutil.copytree(CART_DIR, dest, ignore=shutil.ignore_patterns("__pycache__"))
    cart = dest / "cart.py"
    source = cart.read_text()
    if BUGGY_TOTAL not in source:
        raise AssertionError(f"cart.py no longer contains the known bug: {BUGGY_TOTAL!r}")
    cart.write_text(source.replace(BUGGY_TOTAL, FIXED_TOTAL))
    return dest


@contextmanager
def serve_cart(app_dir: Path = CART_DIR, deadline_s: float = 20.0) -> Iterator[str]:
    """Run ``app.py`` from ``app_dir`` on a free port until the block exits; yields its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "app.py", "--port", str(port)],
        cwd=app_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, base_url, deadline_s)
        yield base_url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def _wait_healthy(proc: subprocess.Popen[bytes], base_url: str, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            stderr = proc.stderr.read().decode() if proc.stderr is not None else ""
            raise RuntimeError(f"cart app exited with {proc.returncode}: {stderr}")
        try:
            with urllib.request.urlopen(f"{base_url}/healthz", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    raise RuntimeError(f"cart app did not answer {base_url}/healthz within {deadline_s} s")


class _HtmlHandler(QuietHandler):
    """A handler answering HTML, silently."""

    def _send(self, status: int, body: str) -> None:
        self.answer(status, body.encode(), ("Content-Type", "text/html; charset=utf-8"))


class PagesHandler(_HtmlHandler):
    server: PagesServer

    def do_GET(self) -> None:
        if self.path == "/flaky":
            self._send(200, f'<p id="verdict">{self.server.next_verdict()}</p>')
        elif self.path == "/noisy":
            self._send(200, self.server.noisy_page())
        else:
            self._send(404, "not found")


class PagesServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), PagesHandler)
        self._served = 0
        self._lock = threading.Lock()
        self.refusing_port = free_port()

    def next_verdict(self) -> str:
        """``bad`` on the 1st, 3rd, ... request; ``good`` in between."""
        with self._lock:
            self._served += 1
            return "bad" if self._served % 2 else "good"

    def noisy_page(self) -> str:
        return f"""<!doctype html><html><body><p>noisy</p><script>
console.error("noisy page says boom");
setTimeout(() => {{ throw new Error("kaboom from the page"); }}, 0);
Promise.allSettled([fetch("/missing-resource"), fetch("http://127.0.0.1:{self.refusing_port}/refused")])
  .then(() => document.body.insertAdjacentHTML("beforeend", '<p id="done">done</p>'));
</script></body></html>"""


@contextmanager
def serve_pages() -> Iterator[PagesServer]:
    """``/flaky`` alternates bad/good; ``/noisy`` logs an error, throws, and makes a 404 and a refused request."""
    server = PagesServer()
    with served(server):
        yield server


def base_url_of(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host!s}:{port}"


class StaticPagesHandler(_HtmlHandler):
    server: StaticPages

    def do_GET(self) -> None:
        body = self.server.pages.get(self.path)
        if body is None:
            self._send(404, "not found")
        else:
            self._send(200, body)


class StaticPages(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, pages: dict[str, str]) -> None:
        super().__init__(("127.0.0.1", 0), StaticPagesHandler)
        self.pages = pages


@contextmanager
def serve_static(pages: dict[str, str]) -> Iterator[str]:
    """Serve ``pages`` (path -> HTML) until the block exits, as one revision of an app; yields its base URL."""
    server = StaticPages(pages)
    with served(server):
        yield base_url_of(server)
