"""Run IDs as the commands take them: ``repair:OWNER/REPO#N``, or ``OWNER/REPO#N`` for short."""

from __future__ import annotations

import argparse

from pipeline.ids import parse_workflow_id


def run_ref(text: str) -> str:
    """The workflow ID ``text`` names: ``text`` itself when it starts with ``repair:``, else ``repair:text``.
    Not validated: a malformed one is a run Temporal does not know."""
    return text if text.startswith("repair:") else f"repair:{text}"


def run_id_from(text: str) -> str:
    """The run (workflow) ID named by ``repair:OWNER/REPO#N`` or ``OWNER/REPO#N``; ``ValueError`` otherwise."""
    run_id = run_ref(text)
    parse_workflow_id(run_id)
    return run_id


def run_option(parser: argparse.ArgumentParser, text: str | None) -> str | None:
    """The run ID a command's ``--run TEXT`` names, None without it; a malformed one is the parser's usage error."""
    if not text:
        return None
    try:
        return run_id_from(text)
    except ValueError as err:
        parser.error(str(err))


def is_run_id(text: str) -> bool:
    """Whether ``text`` is a workflow ID a run could have (``repair:OWNER/REPO#N``)."""
    try:
        parse_workflow_id(text)
    except ValueError:
        return False
    return True
