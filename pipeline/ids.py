"""Stable identities: workflow IDs from a report's source, operation IDs from workflow ID + step.

A workflow ID is derived from where the report came from (``repair:OWNER/REPO#ISSUE``), so a second trigger
for the same issue finds the run that already exists instead of starting another. A retry of an issue whose
run ended (``/durafix retry``, or the trigger label added again) is run ``k`` of the issue, with the
deterministic ID ``repair:OWNER/REPO#ISSUE~k`` (``k >= 2``; the first run has no suffix), so the runs of an
issue are found by describing IDs in order and two racing retries start one run. An operation ID
(``<workflow_id>:<step>[:<attempt>]``) names one logical external effect; every retry of that effect carries
the same ID, which is what lets the receiving system (or our reconciliation) keep exactly one result.
"""

from __future__ import annotations

import re

from reviews.markers import run_branch_prefix

_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_WORKFLOW = re.compile(
    r"^repair:(?P<repo>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)#(?P<issue>\d+)(?:~(?P<run>[2-9]|[1-9]\d+))?$"
)


def workflow_id_for(repository: str, issue_number: int, run: int = 1) -> str:
    """The workflow ID of run ``run`` (1: the first) for a bug report from ``repository`` issue ``issue_number``."""
    if not _REPO.match(repository):
        raise ValueError(f"repository must look like OWNER/REPO, got {repository!r}")
    if issue_number <= 0:
        raise ValueError(f"issue number must be positive, got {issue_number}")
    if run <= 0:
        raise ValueError(f"run number must be positive, got {run}")
    base = f"repair:{repository}#{issue_number}"
    return base if run == 1 else f"{base}~{run}"


def parse_workflow_id(workflow_id: str) -> tuple[str, int]:
    """Inverse of :func:`workflow_id_for` up to the run number: the repository and the issue."""
    repository, issue, _ = parse_run_id(workflow_id)
    return repository, issue


def parse_run_id(workflow_id: str) -> tuple[str, int, int]:
    """Inverse of :func:`workflow_id_for`: repository, issue and run number (1 for an ID without ``~k``)."""
    m = _WORKFLOW.match(workflow_id)
    if not m:
        raise ValueError(f"not a durafix workflow ID: {workflow_id!r}")
    return m["repo"], int(m["issue"]), int(m["run"] or 1)


def is_run_of(workflow_id: str, repository: str) -> bool:
    """Whether ``workflow_id`` is a run (any retry) of an issue of ``repository``."""
    try:
        return parse_run_id(workflow_id)[0] == repository
    except ValueError:
        return False


def op_id(workflow_id: str, step: str, attempt: int | None = None) -> str:
    """``<workflow_id>:<step>[:<attempt>]``: the operation ID of one logical external effect."""
    if not step or ":" in step:
        raise ValueError(f"step must be non-empty and free of ':', got {step!r}")
    return f"{workflow_id}:{step}" if attempt is None else f"{workflow_id}:{step}:{attempt}"


def op_step(op: str, workflow_id: str) -> str | None:
    """The step of ``op`` when it is an operation ID of ``workflow_id`` (:func:`op_id`'s inverse), else None."""
    if not op.startswith(f"{workflow_id}:"):
        return None
    return op[len(workflow_id) + 1 :].split(":", 1)[0] or None


def branch_for(workflow_id: str) -> str:
    """The branch a run publishes its candidate to: one per run, under the run's own ``durafix/<run>/``
    prefix, which is what the forge adapter's footprint and cleanup count as the run's."""
    return f"{run_branch_prefix(workflow_id)}fix"


def attempt_workflow_id(run_workflow_id: str, attempt: int) -> str:
    """A repair attempt's child workflow ID: one per attempt number of the run (revisions have numbers of their
    own)."""
    return f"{run_workflow_id}:attempt-{attempt}"


def run_of(workflow_id: str) -> str:
    """The run a workflow ID belongs to: the run itself, or the run of one of its attempts (the inverse of
    :func:`attempt_workflow_id`)."""
    run, sep, attempt = workflow_id.rpartition(":attempt-")
    return run if sep and attempt.isdigit() else workflow_id
