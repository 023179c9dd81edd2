"""A command or test reproduction as the report reads it: the stored procedure, and each revision's record of
what its commands did, read back from the bundle's artifacts.

The pipeline stores a command or test reproduction's procedure as its model's JSON, with a ``kind`` key
(``command`` or ``test``; a browser procedure has none), and each revision's runs as one ``log`` artifact
named ``<label>-reproduction.json``: ``kind``, ``name``, ``status``, ``detail``, ``command`` (the test
command) and ``runs[]``, each with ``run``, ``steps[]`` (``command``, ``exit_code``, ``timed_out``, ``ran``,
``stdout``, ``stderr``, ``stdout_cut``, ``stderr_cut``), ``checks[]`` (``index``, ``description``,
``holds``, ``actual``, ``error``), ``bug_present``, ``failed_step``, ``error``, ``failing_tests``,
``passing_tests`` and ``test_counts`` (docs/environments.md).

This package sits below ``environments`` (it may not import the runner's models), so both are read with small
models of its own that take exactly those fields and ignore any other. Everything in them is untrusted (a
report wrote the commands, the repository's code wrote the output): a record of the wrong shape is not
shown, and the reader says why instead of raising (except a failed integrity check, which fails the render
rather than show tampered evidence).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evidence.bundle import RevisionEvidence
from evidence.interface import ArtifactRef, ArtifactStore
from evidence.observations import MAX_LOG_BYTES

SandboxKind = Literal["command", "test"]
RECORD_SUFFIX = "reproduction.json"


class _Read(BaseModel):
    # Strict: the record is JSON written by a model dump, so a value of another type is a sign of tampering.
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class StepRun(_Read):
    """One command of one run; ``exit_code`` None when it was stopped at its timeout or never ran."""

    command: str = ""
    exit_code: int | None = None
    timed_out: bool = False
    ran: bool = True
    stdout: str = ""
    stderr: str = ""
    stdout_cut: bool = False
    stderr_cut: bool = False


class CheckRun(_Read):
    """One ``bug_present`` check in one run: ``holds`` None when it could not be read (``error`` says why)."""

    index: int
    description: str = ""
    holds: bool | None = None
    actual: str | None = None
    error: str | None = None


class RunRecord(_Read):
    run: int
    steps: list[StepRun] = Field(default_factory=list)
    checks: list[CheckRun] = Field(default_factory=list)
    bug_present: bool = False
    failed_step: int | None = None
    error: str | None = None
    failing_tests: list[str] = Field(default_factory=list)
    passing_tests: list[str] = Field(default_factory=list)
    test_counts: str = ""


class SandboxRecord(_Read):
    """One revision's command or test reproduction: its verdict and every run."""

    kind: SandboxKind
    name: str = ""
    status: str = ""
    detail: str = ""
    runs: list[RunRecord] = Field(default_factory=list)
    command: str = ""

    @property
    def run_numbers(self) -> list[int]:
        return sorted({r.run for r in self.runs})

    def run(self, number: int) -> RunRecord | None:
        return next((r for r in self.runs if r.run == number), None)


class StepSpec(_Read):
    run: str
    timeout_s: int | None = None


class CheckSpec(_Read):
    """A ``bug_present`` check as the procedure states it: what it reads, and its one comparison."""

    check: str
    path: str | None = None
    equals: str | None = None
    not_equals: str | None = None
    contains: str | None = None
    matches: str | None = None

    @property
    def comparison(self) -> tuple[str, str] | None:
        """``(how, operand)``, or None when the procedure states none."""
        given = ((k, getattr(self, k)) for k in ("equals", "not_equals", "contains", "matches"))
        return next(((k, v) for k, v in given if v is not None), None)


class SandboxProcedureView(_Read):
    """The stored command or test procedure (its model's JSON), the fields the report shows."""

    kind: SandboxKind
    name: str = ""
    files: dict[str, str] = Field(default_factory=dict)
    steps: list[StepSpec] = Field(default_factory=list)
    bug_present: list[CheckSpec] = Field(default_factory=list)
    tests: list[str] = Field(default_factory=list)
    timeout_s: int | None = None
    runs: int = 1


@dataclass(frozen=True)
class StoredProcedure:
    """The stored procedure: its ``kind`` (``browser`` when it names none), and for a command or test
    procedure the view of it (None when it does not read as one; ``problem`` says why)."""

    kind: str
    view: SandboxProcedureView | None = None
    problem: str | None = None


def procedure_kind(text: str) -> StoredProcedure:
    """What kind of reproduction the stored procedure ``text`` is, and its view when it is a command or test."""
    try:
        loaded: Any = yaml.safe_load(text)
    except yaml.YAMLError:
        return StoredProcedure(kind="browser")
    if not isinstance(loaded, dict) or loaded.get("kind") not in ("command", "test"):
        return StoredProcedure(kind="browser")
    kind = str(loaded["kind"])
    # YAML reads JSON, but not strictly typed as JSON is: validate the loaded mapping in Python mode.
    try:
        return StoredProcedure(kind=kind, view=SandboxProcedureView.model_validate(loaded))
    except ValidationError as err:
        return StoredProcedure(kind=kind, problem=_first_error(err))


@dataclass(frozen=True)
class SandboxRuns:
    """One revision's record (None when it could not be read: ``note`` says why) and the artifact it came from."""

    record: SandboxRecord | None
    log: ArtifactRef | None = None
    note: str | None = None


def is_record_name(name: str) -> bool:
    return name == RECORD_SUFFIX or name.endswith(f"-{RECORD_SUFFIX}")


def read_sandbox_runs(side: RevisionEvidence, store: ArtifactStore) -> SandboxRuns:
    """The record in ``side``'s ``<label>-reproduction.json`` log.

    Raises :class:`IntegrityError` when its bytes do not match its sha256.
    """
    ref = next((r for r in side.logs if is_record_name(r.name)), None)
    if ref is None:
        return SandboxRuns(record=None, note="no reproduction record was stored")
    if ref.size > MAX_LOG_BYTES:
        return SandboxRuns(record=None, log=ref, note=f"could not be shown: {ref.name} is too large ({ref.size} bytes)")
    try:
        document = json.loads(store.read_bytes(ref))
    except (UnicodeDecodeError, ValueError):
        return SandboxRuns(record=None, log=ref, note=f"could not be shown: {ref.name} is not JSON")
    try:
        record = SandboxRecord.model_validate(document)
    except ValidationError as err:
        why = f"{ref.name} is not a record of a command or test reproduction ({_first_error(err)})"
        return SandboxRuns(record=None, log=ref, note=f"could not be shown: {why}")
    return SandboxRuns(record=record, log=ref)


def _first_error(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "the document"
    return f"{where}: {first['msg']}"
