"""What the benches share in their command lines and their printed results."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def argument_parser(doc: str | None) -> argparse.ArgumentParser:
    """A bench's argument parser, described by the first line of its module docstring (``doc``; none when absent)."""
    return argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)


def print_rows(rows: Sequence[tuple[str, str]]) -> None:
    """Print ``(label, value)`` rows as two columns, the values aligned after the longest label."""
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
