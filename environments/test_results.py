"""Per-test results: a JUnit XML report read into test cases, and a candidate's cases compared with the base's.

A recipe that names ``test_report`` (the JUnit XML file its ``test`` command writes, relative to the workspace)
lets durafix judge a candidate per test instead of by the command's exit code alone: a candidate passes when it
fails no test that passes on the base, so a repository whose base already fails some tests can still be
repaired. JUnit XML is what pytest (``--junitxml``), node's test runner (``--test-reporter=junit``), jest,
jasmine and mocha reporters, go-junit-report and most CI tools write.

The report is written by the repository's own commands, so it is read defensively: a size cap
(:data:`MAX_REPORT_BYTES`), a cap on the number of cases (:data:`MAX_CASES`), no DTDs or entities (the parser
refuses a document that declares any), and names cut to :data:`MAX_NAME_CHARS`. A report that is missing or
unreadable is ``None`` with the reason, never an empty pass.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from xml.etree import ElementTree

from pydantic import BaseModel, Field

from environments.untrusted_files import UntrustedFileError, read_beneath_cut

MAX_REPORT_BYTES = 32 * 1024 * 1024
MAX_CASES = 100_000
MAX_NAME_CHARS = 300


class CaseOutcome(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"


class TestCases(BaseModel):
    """One run's test cases by identity (``classname::name``, or ``file::name`` when the report has no class)."""

    __test__ = False  # a result model, not a pytest test class

    cases: dict[str, CaseOutcome] = Field(default_factory=dict)

    def named(self, outcome: CaseOutcome) -> list[str]:
        return sorted(name for name, seen in self.cases.items() if seen == outcome)

    def counts(self) -> str:
        """``12 passed, 1 failed, 2 skipped`` (zero counts left out; ``no test cases`` when empty)."""
        said = [f"{len(self.named(o))} {o.value}" for o in CaseOutcome if self.named(o)]
        return ", ".join(said) or "no test cases"

    def to_json(self) -> bytes:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> TestCases:
        return cls.model_validate_json(data)


class ReportError(ValueError):
    """The JUnit report is missing, too big or not a JUnit report; the message says which."""


def read_workspace_report(workspace: Path, report: str) -> TestCases:
    """:func:`read_junit` of the report ``report`` names inside ``workspace``. The file was written by the
    repository's commands, so it is opened beneath the workspace with no link followed at any component
    (:mod:`environments.untrusted_files`): a link, a FIFO, a path leading outside or a file over the size
    limit is refused, never read."""
    try:
        data, cut = read_beneath_cut(workspace, report, max_bytes=MAX_REPORT_BYTES)
    except UntrustedFileError as exc:
        if "was not written" in str(exc):
            raise ReportError(f"the test report {report} was not written") from None
        raise ReportError(f"the test report {exc!s}") from None
    if cut:
        raise ReportError(f"the test report {report} is over the {MAX_REPORT_BYTES}-byte limit")
    return parse_junit(data, Path(report).name)


def read_junit(path: Path) -> TestCases:
    """The test cases in the JUnit XML report at ``path`` (a file of the worker's; see :func:`parse_junit`).

    Raises :class:`ReportError` for a missing, oversized or malformed report, or one declaring a DTD.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ReportError(f"the test report {path.name} was not written") from None
    if size > MAX_REPORT_BYTES:
        raise ReportError(f"the test report {path.name} is {size} bytes, over the {MAX_REPORT_BYTES}-byte limit")
    return parse_junit(path.read_bytes(), path.name)


def parse_junit(data: bytes, name: str) -> TestCases:
    """The test cases in a JUnit XML report (``<testcase>`` elements anywhere in it).

    A case with a ``<failure>`` or ``<error>`` child failed, one with ``<skipped>`` was skipped, any other
    passed. A name seen twice (a retried test) keeps its worst outcome: failed over passed over skipped.
    """
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
        raise ReportError(f"the test report {name} declares a DTD or entities, which are not read")
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError as err:
        raise ReportError(f"the test report {name} is not well-formed XML: {err}") from None
    cases: dict[str, CaseOutcome] = {}
    rank = {CaseOutcome.SKIPPED: 0, CaseOutcome.PASSED: 1, CaseOutcome.FAILED: 2}
    for element in root.iter("testcase"):
        if len(cases) >= MAX_CASES:
            raise ReportError(f"the test report {name} holds more than {MAX_CASES} test cases")
        owner = element.get("classname") or element.get("file") or ""
        name = f"{owner}::{element.get('name', '')}" if owner else element.get("name", "")
        name = name[:MAX_NAME_CHARS]
        children = {child.tag for child in element}
        if children & {"failure", "error"}:
            outcome = CaseOutcome.FAILED
        elif "skipped" in children:
            outcome = CaseOutcome.SKIPPED
        else:
            outcome = CaseOutcome.PASSED
        if name not in cases or rank[outcome] > rank[cases[name]]:
            cases[name] = outcome
    if not cases:
        raise ReportError(f"the test report {name} holds no test cases")
    return TestCases(cases=cases)


def regressions(base: TestCases, candidate: TestCases) -> list[str]:
    """The cases that pass on the base and do not pass on the candidate: failed, or gone (a test the patch
    deleted or renamed counts against it; skipped on the candidate counts too). Sorted."""
    return sorted(
        name
        for name, outcome in base.cases.items()
        if outcome == CaseOutcome.PASSED and candidate.cases.get(name) != CaseOutcome.PASSED
    )


def fixed(before: TestCases, after: TestCases) -> list[str]:
    """The cases that fail in ``before`` and pass in ``after``, sorted: what a regression proof shows."""
    return sorted(
        name
        for name, outcome in before.cases.items()
        if outcome == CaseOutcome.FAILED and after.cases.get(name) == CaseOutcome.PASSED
    )
