"""Argument parsing of the ``durafix`` command line."""

from __future__ import annotations

import argparse
from datetime import timedelta

import pytest

from pipeline.cli import build_parser, parse_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("30m", timedelta(minutes=30)),
        ("2h", timedelta(hours=2)),
        ("1.5d", timedelta(hours=36)),
    ],
)
def test_durations_take_one_unit(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "h", "2", "2w", "-1h", "0m", "soonh"])
def test_bad_durations_are_refused_with_the_accepted_form(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="a positive number and one of s, m, h, d"):
        parse_duration(text)


def test_approve_takes_a_validity(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["approve", "acme/shop#1", "--sha", "a" * 40, "--valid-for", "2h"])
    assert args.valid_for == timedelta(hours=2)
    assert build_parser().parse_args(["approve", "acme/shop#1", "--sha", "a" * 40]).valid_for is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["approve", "acme/shop#1", "--sha", "a" * 40, "--valid-for", "later"])
    assert "bad duration 'later'" in capsys.readouterr().err
