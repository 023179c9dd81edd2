"""What the page did during one run: console messages, page errors, failed requests, error responses, the
steps and assertions themselves, and crashes, as timestamped events for the run's JSON log.

The recorder also remembers the status of every same-origin response, which ``expect_response_status``
reads. Events are capped per run so a page that logs in a loop cannot grow the log without bound; the number
dropped is recorded.

It also keeps the requests the run's origin policy aborted (``blocked``: method, URL, resource type), capped
the same way (``blocked_dropped`` counts the rest) and with each URL cut to :data:`MAX_URL_CHARS`, since the
page chooses them.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

from playwright.async_api import BrowserContext, ConsoleMessage, Page, Request, Response

MAX_EVENTS = 2_000
MAX_BLOCKED = 200
MAX_URL_CHARS = 2_000


class RunRecorder:
    def __init__(self, base_url: str) -> None:
        base = urlsplit(base_url)
        self._origin = (base.scheme, base.netloc)
        self._started = time.monotonic()
        self.events: list[dict[str, Any]] = []
        self.dropped = 0
        self.crashed = False
        self._statuses: list[tuple[str, str, int]] = []
        self.blocked: list[dict[str, str]] = []
        self.blocked_dropped = 0

    def attach(self, context: BrowserContext) -> None:
        """Listen on the whole context, so popups and frames the app opens are recorded too."""
        context.on("console", self._on_console)
        context.on("weberror", lambda err: self.add("pageerror", message=str(err.error)))
        context.on("requestfailed", self._on_request_failed)
        context.on("response", self._on_response)

    def attach_page(self, page: Page) -> None:
        page.on("crash", self._on_crash)

    def add(self, kind: str, **fields: Any) -> None:
        if len(self.events) >= MAX_EVENTS:
            self.dropped += 1
            return
        self.events.append({"t": round(time.monotonic() - self._started, 3), "kind": kind, **fields})

    def block(self, method: str, url: str, resource_type: str) -> None:
        """Note a request the origin policy aborted (also as a ``blocked`` event on the run's timeline)."""
        shown = url if len(url) <= MAX_URL_CHARS else url[:MAX_URL_CHARS] + "..."
        if len(self.blocked) >= MAX_BLOCKED:
            self.blocked_dropped += 1
        else:
            self.blocked.append({"method": method, "url": shown, "resource_type": resource_type})
        self.add("blocked", method=method, url=shown, resource_type=resource_type)

    def latest_status(self, path: str) -> int | None:
        """Status of the latest same-origin response whose path (plus query, when ``path`` has one) is ``path``."""
        with_query = "?" in path
        for full, bare, status in reversed(self._statuses):
            if (full if with_query else bare) == path:
                return status
        return None

    def _on_console(self, message: ConsoleMessage) -> None:
        location = message.location
        self.add(
            "console",
            level=message.type,
            text=message.text,
            location=f"{location.get('url', '')}:{location.get('lineNumber', '')}",
        )

    def _on_request_failed(self, request: Request) -> None:
        self.add("requestfailed", method=request.method, url=request.url, failure=request.failure)

    def _on_response(self, response: Response) -> None:
        url = urlsplit(response.url)
        if (url.scheme, url.netloc) == self._origin:
            full = f"{url.path}?{url.query}" if url.query else url.path
            self._statuses.append((full, url.path, response.status))
        if response.status >= 400:
            self.add("response", method=response.request.method, url=response.url, status=response.status)

    def _on_crash(self, _page: Page) -> None:
        self.crashed = True
        self.add("crash")
