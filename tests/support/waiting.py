"""Waiting for a condition in tests: polled until it holds or a deadline passes, then an assertion error that
says what was awaited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


def wait_for(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.3) -> Any:
    """``predicate()`` every ``interval_s`` until it returns something truthy, which is returned."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


async def eventually(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """``predicate`` (sync or async) until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.2)
