"""Helpers for the provisioning progress a provider reports (contract: :data:`environments.interface.Progress`)."""

from __future__ import annotations

COMMAND_CHARS = 80


def ignore(text: str) -> None:
    """The progress callback of a caller that did not ask for progress."""


def command_text(command: str, limit: int = COMMAND_CHARS) -> str:
    """``command`` as one line (whitespace runs collapsed), cut to ``limit`` characters ending in ``…``."""
    line = " ".join(command.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
