"""Crafted webhook payloads stamped as events that just happened.

The receiver refuses a trigger, a cancel or a command whose payload says it happened longer ago than its window
(:mod:`pipeline.replays`), as it would refuse a replay. GitHub's example payloads are from 2019: a test sending
one as a fresh event stamps it with now, as the forge stamps what it sends (whole seconds, UTC).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pipeline.replays import STAMPS


def forge_now() -> str:
    """Now, as the forge writes its timestamps."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stamped_now(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` (changed in place, and returned) with every timestamp the receiver judges set to now."""
    now = forge_now()
    for holder, key in STAMPS.values():
        part = payload.get(holder)
        if isinstance(part, dict) and key in part:
            part[key] = now
    return payload
