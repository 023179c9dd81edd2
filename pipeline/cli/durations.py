"""Durations on the command line: ``durafix approve --valid-for``, ``durafix cache prune --older-than``."""

from __future__ import annotations

import argparse
from datetime import timedelta

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """``90s``, ``30m``, ``2h``, ``1d`` (a positive number and one unit); an argparse type, so anything else
    raises :class:`argparse.ArgumentTypeError` naming the accepted form."""
    number, unit = text[:-1], text[-1:].lower()
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in _DURATION_UNITS or value <= 0:
        raise argparse.ArgumentTypeError(f"bad duration {text!r}: a positive number and one of s, m, h, d")
    return timedelta(seconds=value * _DURATION_UNITS[unit])
