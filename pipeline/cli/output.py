"""Command output: JSON documents on stdout, and for the on-call commands (``durafix cleanup``, ``durafix
cache``) text as it comes or one JSON document at the end, with warnings and refusals always on stderr,
prefixed with the command's name."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any


def print_json(obj: Any) -> None:
    """``obj`` as indented JSON on stdout; values JSON does not know (datetimes, paths) as their ``str``."""
    print(json.dumps(obj, indent=2, default=str))


@dataclass
class Printer:
    """Text goes to stdout as it comes; with ``--json`` one document is printed at the end instead.
    Warnings and refusals always go to stderr."""

    prog: str
    as_json: bool
    document: dict[str, Any] = field(default_factory=dict)

    def line(self, text: str = "") -> None:
        if not self.as_json:
            print(text)

    def warn(self, text: str) -> None:
        print(f"{self.prog}: {text}", file=sys.stderr)

    def finish(self, code: int) -> int:
        if self.as_json:
            print(json.dumps(self.document, indent=2))
        return code
