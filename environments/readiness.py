"""The HTTP readiness probe: one GET, or polling until an expected status or a deadline.

Proxies from the worker's environment are ignored (``trust_env=False``): the probe must reach the
environment itself, never a proxy that answers for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from environments.interface import ReadinessProbe

_POLL_S = 0.1


def probe_once(base_url: str, probe: ReadinessProbe, *, timeout_s: float = 2.0) -> bool:
    """Whether ``GET base_url + probe.path`` answers ``probe.expected_status`` now."""
    try:
        with httpx.Client(trust_env=False, timeout=timeout_s) as client:
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
