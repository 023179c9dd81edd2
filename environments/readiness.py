"""The HTTP readiness probes: whether the app answers at all, one GET for an expected status, or polling
until that status or a deadline.

Proxies from the worker's environment (``HTTP_PROXY``, ``ALL_PROXY`` and the rest) are ignored
(``trust_env=False``): a probe must reach the environment itself, never a proxy that answers for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from environments.interface import ReadinessProbe

_POLL_S = 0.1


def _client(timeout_s: float) -> httpx.Client:
    """The one client every probe uses: no proxies from the environment, redirects not followed."""
    return httpx.Client(trust_env=False, timeout=timeout_s, follow_redirects=False)


def answers(base_url: str, path: str = "/", *, timeout_s: float = 5.0) -> str | None:
    """``None`` when ``GET base_url + path`` gets any HTTP response (4xx and 5xx included), else why not.

    For "is the app still there" rather than "is it ready": an app that answers with an error is up. The
    reason is a short text naming the failure (refused, timed out, not HTTP). A trailing ``/`` of
    ``base_url`` is dropped, so ``path`` always starts the path. The body is not read.
    """
    try:
        with _client(timeout_s) as client, client.stream("GET", base_url.rstrip("/") + path):
            return None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def probe_once(base_url: str, probe: ReadinessProbe, *, timeout_s: float = 2.0) -> bool:
    """Whether ``GET base_url + probe.path`` answers ``probe.expected_status`` now."""
    try:
        with _client(timeout_s) as client:
            return client.get(base_url + probe.path).status_code == probe.expected_status
    except httpx.HTTPError:
        return False


def wait_ready(base_url: str, probe: ReadinessProbe, *, still_running: Callable[[], bool]) -> bool:
    """Poll until the probe passes (``True``), or its deadline passes or the process ends (``False``)."""
    deadline = time.monotonic() + probe.deadline_s
    while True:
        if probe_once(base_url, probe, timeout_s=max(0.1, min(2.0, deadline - time.monotonic()))):
            return True
        if not still_running() or time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def verdict(base_url: str, probe: ReadinessProbe, *, timeout_s: float = 2.0) -> str:
    """What one more ``GET base_url + probe.path`` finds once readiness gave up, as the environment's log says it
    (and :func:`environments.diagnosis.diagnose` reads it): ``readiness: GET /healthz answered 404, expected 200``
    or ``readiness: nothing answered on $PORT (<why>)``."""
    try:
        with _client(timeout_s) as client:
            status = client.get(base_url + probe.path).status_code
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        return f"readiness: nothing answered on $PORT ({type(exc).__name__})"
    return f"readiness: GET {probe.path} answered {status}, expected {probe.expected_status}"
