"""What each check of a reproduction observed, read back from the runner's stored ``log.json``.

The report shows, per check (``bug_present`` assertion) and per run, the value the page showed, whether the
check held, and the screenshots the runner took for it. All of that is in the reproduction's log, which is
already in the bundle as an artifact of kind ``log``, so reading it needs nothing beyond the bundle.

This package sits below ``browser`` (it may not import the runner's models), so the log is read as JSON
with the fields ``docs/browser.md`` documents: ``runs[].run`` and ``runs[].outcome`` with ``bug_present``,
``failed_step``, ``error`` and ``assertions[]`` (``index``, ``description``, ``holds``, ``actual``,
``error``, ``screenshot``, ``element_screenshot``; the screenshots by file name). The log is as untrusted as
the page it recorded: a field of the wrong type is treated as absent, and a log that cannot be read gives
no observations and a note saying why, never an exception (except a failed integrity check, which must
fail the render rather than show tampered evidence).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from evidence.bundle import RevisionEvidence
from evidence.interface import ArtifactRef, ArtifactStore

# A log holds at most 2000 events per run and 10 runs; this bounds what a render reads into memory.
MAX_LOG_BYTES = 64 * 1024 * 1024
# The runner's file names (``run-1-assert-2-element.png``); the storing side prefixes them.
_RUNNER_NAME = re.compile(r"(?:^|-)(run-(\d+)-(step|assert)-(\d+)(-failed|-element)?\.png)$")


@dataclass(frozen=True)
class CheckObservation:
    """One check in one run. ``holds`` is None when it was not evaluated (``error`` says why)."""

    run: int
    holds: bool | None
    actual: str | None
    error: str | None
    # File names as the runner wrote them; see screenshot_named.
    screenshot: str | None = None
    element_screenshot: str | None = None
    # Whether the run as a whole showed the bug (every check held in it).
    run_bug_present: bool = False


@dataclass
class Observations:
    """Per check index, what each run observed; ``note`` says what could not be read or evaluated."""

    checks: dict[int, dict[int, CheckObservation]] = field(default_factory=dict)
    descriptions: dict[int, str] = field(default_factory=dict)
    runs: list[int] = field(default_factory=list)
    # Why a run evaluated no check (a failed step, a cancelled or crashed run), by run.
    stopped: dict[int, str] = field(default_factory=dict)
    log: ArtifactRef | None = None
    note: str | None = None

    def for_check(self, index: int) -> list[CheckObservation]:
        """Every run's observation of check ``index``, in run order; a run that did not evaluate it is
        there too, with ``holds`` None and the reason as ``error``."""
        seen = self.checks.get(index, {})
        return [
            seen.get(run) or CheckObservation(run=run, holds=None, actual=None, error=self.stopped.get(run))
            for run in self.runs
        ]


def read_observations(side: RevisionEvidence, store: ArtifactStore) -> Observations:
    """The observations in ``side``'s reproduction log: the first of its logs that reads as one.

    Raises :class:`IntegrityError` when a log's bytes do not match its sha256.
    """
    if not side.logs:
        return Observations(note="no reproduction log was recorded")
    notes = []
    for ref in side.logs:
        if ref.size > MAX_LOG_BYTES:
            notes.append(f"{ref.name} is too large to read ({ref.size} bytes)")
            continue
        try:
            document = json.loads(store.read_bytes(ref))
        except (UnicodeDecodeError, ValueError):
            notes.append(f"{ref.name} is not JSON")
            continue
        observations = observations_in(document)
        if observations is None:
            notes.append(f"{ref.name} is not a reproduction log")
            continue
        observations.log = ref
        return observations
    return Observations(note="; ".join(notes))


def observations_in(document: object) -> Observations | None:
    """The observations in a parsed ``log.json`` document; None when it is not a reproduction log."""
    if not isinstance(document, dict) or not isinstance(document.get("runs"), list):
        return None
    return _from_log(document["runs"])


def screenshot_named(refs: list[ArtifactRef], file_name: str | None) -> ArtifactRef | None:
    """The stored screenshot the runner wrote as ``file_name``: stored names keep the runner's name after a
    prefix ending in ``-`` (``reproduce-base-run-1-assert-1.png``), or are exactly it."""
    if not file_name:
        return None
    return next((r for r in refs if r.name == file_name or r.name.endswith(f"-{file_name}")), None)


@dataclass(frozen=True)
class Moment:
    """When the runner took a screenshot, from its file name; ``key`` aligns base and candidate."""

    key: str
    label: str


def moment_of(name: str) -> Moment:
    """``reproduce-base-run-1-step-3.png`` -> run 1, after step 3; a name of another shape is its own key."""
    match = _RUNNER_NAME.search(name)
    if match is None:
        return Moment(key=name, label=name)
    file_name, run, kind, number, suffix = match.groups()
    if kind == "step":
        what = f"step {number} failed" if suffix == "-failed" else f"after step {number}"
    else:
        what = f"check {number}, the element it read" if suffix == "-element" else f"check {number}"
    return Moment(key=file_name, label=f"run {run}: {what}")


def _from_log(runs: list[Any]) -> Observations:
    observations = Observations()
    for entry in runs:
        if not isinstance(entry, dict) or not isinstance(entry.get("run"), int) or entry["run"] in observations.runs:
            continue
        run: int = entry["run"]
        observations.runs.append(run)
        outcome = entry.get("outcome")
        if not isinstance(outcome, dict):
            observations.stopped[run] = "the run ended before it had an outcome (cancelled, or the browser failed)"
            continue
        bug_present = outcome.get("bug_present") is True
        assertions = outcome.get("assertions")
        for item in assertions if isinstance(assertions, list) else []:
            if not isinstance(item, dict) or not isinstance(item.get("index"), int):
                continue
            index: int = item["index"]
            holds = item.get("holds")
            observations.checks.setdefault(index, {})[run] = CheckObservation(
                run=run,
                holds=holds if isinstance(holds, bool) else None,
                actual=_text(item.get("actual")),
                error=_text(item.get("error")),
                screenshot=_text(item.get("screenshot")),
                element_screenshot=_text(item.get("element_screenshot")),
                run_bug_present=bug_present,
            )
            description = _text(item.get("description"))
            if description is not None:
                observations.descriptions.setdefault(index, description)
        if not isinstance(assertions, list) or not assertions:
            # The runner's error names the failed step ("step 2 (click '#pay'): ...").
            observations.stopped[run] = f"not evaluated: {_text(outcome.get('error')) or 'no check was reached'}"
    observations.runs.sort()
    notes = [f"run {run}: {why}" for run, why in sorted(observations.stopped.items())]
    observations.note = "; ".join(notes) or None
    return observations


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
