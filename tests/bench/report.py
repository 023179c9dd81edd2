"""What the benches share in their command lines and their printed results."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def argument_parser(doc: str | None) -> argparse.ArgumentParser:
    """A bench's argument parser, described by the first line of its module docstring (``doc``; none when absent)."""
    return argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)


def counted(doc: str | None, option: str, default: int, what: str) -> int:
    """The one count a bench's command line sets: ``option N`` (``what`` says what is counted), else 1 with
    ``--quick``, else ``default``."""
    parser = argument_parser(doc)
    parser.add_argument(option, type=int, default=None, help=f"{what} (default {default})")
    parser.add_argument("--quick", action="store_true", help=f"as {option} 1")
    args = parser.parse_args()
    given: int | None = getattr(args, option.removeprefix("--"))
    return given or (1 if args.quick else default)


def print_rows(rows: Sequence[tuple[str, str]]) -> None:
    """Print ``(label, value)`` rows as two columns, the values aligned after the longest label."""
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
