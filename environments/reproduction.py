"""The kinds of reproduction a report's ``durafix-repro`` block may hold, and the one parser for all of them.

- ``browser`` (the default when ``kind`` is absent): a browser procedure against the running app,
  :class:`browser.procedure.Procedure`.
- ``command``: commands run one after another in the sandboxed environment (the recipe's setup done, no
  network, no app; with ``app: true``, against the running app, which is all they reach), each with its own
  timeout; ``bug_present`` checks read the last command's exit status, stdout, stderr or a file it wrote.
- ``test``: test files or test IDs run with the recipe's ``test_subset``; the bug is present when they fail.

``command`` and ``test`` reproductions may carry ``files``: small files (a script, a test) written into the
workspace before the first command, inside the sandbox, so they land nowhere else. A drafted test travels this
way into the repair's workspace and the candidate's regression proof.

Everything here comes from an untrusted issue (or a model that read one): the schema is closed (unknown keys
are errors), sizes are capped, every file path is a plain relative path that stays in the workspace and
touches neither git's metadata nor durafix's own output directory, and every regular expression is compiled at
validation time by the linear-time engine that evaluates it (:mod:`browser.patterns`). Commands are run only
in the sandbox, never by the worker's shell (:mod:`environments.command_repro`).

A browser procedure is stored exactly as before kinds existed (no ``kind`` key), so its stored form and its
digest are unchanged; a command or test reproduction is stored with its ``kind``, which :func:`load_reproduction`
reads back.
"""

from __future__ import annotations

import json
import posixpath
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from browser.patterns import MAX_PATTERN_CHARS, validate_pattern
from browser.procedure import MAX_RUNS, Procedure, ProcedureError, find_block, parse_yaml_model

# Where a command reproduction's outputs are written in the workspace (the runner's, never the repository's).
OUTPUT_DIR = ".durafix-repro"
MAX_FILES = 20
MAX_FILE_CHARS = 32_000
MAX_FILES_CHARS = 48_000
MAX_COMMAND_CHARS = 4_000
MAX_STEP_TIMEOUT_S = 900
DEFAULT_STEP_TIMEOUT_S = 120
MAX_TEST_TIMEOUT_S = 3_600
DEFAULT_TEST_TIMEOUT_S = 600


class ReproductionKind(StrEnum):
    BROWSER = "browser"
    COMMAND = "command"
    TEST = "test"


def _workspace_file(path: str) -> str:
    # Written by the sandbox into the workspace: it must stay there and leave git's metadata and our outputs alone.
    if not path or path.startswith("/") or "\\" in path or "\x00" in path:
        raise ValueError(f"a file path must be relative to the repository root, got {path!r}")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts) or posixpath.normpath(path) != path:
        raise ValueError(f"a file path must be plain (no '.', '..' or empty parts), got {path!r}")
    if parts[0] in (".git", OUTPUT_DIR) or ".git" in parts:
        raise ValueError(f"a file path may not be under .git or {OUTPUT_DIR}, got {path!r}")
    if any(ord(ch) < 0x20 for ch in path):
        raise ValueError(f"a file path may not hold control characters, got {path!r}")
    return path


def _files_size(files: dict[str, str]) -> dict[str, str]:
    total = sum(len(text) for text in files.values())
    if total > MAX_FILES_CHARS:
        raise ValueError(f"files hold {total} characters in all; at most {MAX_FILES_CHARS}")
    for path in files:
        _workspace_file(path)
    return files


WorkspaceFile = Annotated[str, Field(min_length=1, max_length=300), AfterValidator(_workspace_file)]
Pattern = Annotated[str, Field(max_length=MAX_PATTERN_CHARS), AfterValidator(validate_pattern)]
Files = Annotated[
    dict[Annotated[str, Field(min_length=1, max_length=300)], Annotated[str, Field(max_length=MAX_FILE_CHARS)]],
    Field(max_length=MAX_FILES),
    AfterValidator(_files_size),
]
Name = Annotated[str, Field(min_length=1, max_length=200)]
Runs = Annotated[int, Field(ge=1, le=MAX_RUNS)]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CommandStep(_Closed):
    """One command, run by ``/bin/sh -c`` in the workspace, stdin empty; killed after ``timeout_s``."""

    run: Annotated[str, Field(min_length=1, max_length=MAX_COMMAND_CHARS)]
    timeout_s: Annotated[int, Field(ge=1, le=MAX_STEP_TIMEOUT_S)] = DEFAULT_STEP_TIMEOUT_S


class OutputCheck(_Closed):
    """What the last command left, compared in exactly one way.

    ``check`` reads ``exit_status`` (the decimal exit code, e.g. ``"1"``), ``stdout``, ``stderr``, or ``file``
    (the workspace file ``path``, as the command left it). ``equals``/``not_equals`` compare the whole text
    with trailing whitespace removed; ``contains`` is a substring; ``matches`` an RE2 search.
    """

    check: Literal["exit_status", "stdout", "stderr", "file"]
    path: WorkspaceFile | None = None
    equals: str | None = None
    not_equals: str | None = None
    contains: str | None = None
    matches: Pattern | None = None

    @model_validator(mode="after")
    def _one_comparison(self) -> OutputCheck:
        given = [k for k in ("equals", "not_equals", "contains", "matches") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"a check needs exactly one of equals, not_equals, contains, matches (got {given})")
        if (self.check == "file") != (self.path is not None):
            raise ValueError("`path` is given with `check: file` and only then")
        return self

    @property
    def comparison(self) -> tuple[str, str]:
        """``(how, operand)``: the one comparison given."""
        given = ((k, getattr(self, k)) for k in ("equals", "not_equals", "contains", "matches"))
        return next((k, v) for k, v in given if v is not None)

    def describe(self) -> str:
        """One line a human can read, e.g. ``stdout contains 'Traceback'``."""
        source = f"file {self.path}" if self.check == "file" else self.check
        how, operand = self.comparison
        return f"{source} {how} {operand!r}"


class CommandProcedure(_Closed):
    """Commands bring a fresh workspace (set up by the recipe) to the state where the bug shows; the bug is
    present when ALL of ``bug_present`` hold for the last command. Every command before the last must exit 0,
    else the run could not be completed. ``runs`` > 1 repeats the whole procedure to detect a flaky result."""

    version: Literal[1]
    kind: Literal["command"]
    name: Name
    files: Files = Field(default_factory=dict)
    steps: Annotated[list[CommandStep], Field(min_length=1, max_length=20)]
    bug_present: Annotated[list[OutputCheck], Field(min_length=1, max_length=20)]
    runs: Runs = 1
    app: bool = Field(
        default=False,
        description="the commands need the app running: they run in the provisioned environment (the recipe's "
        "`start` and `readiness`), reaching the app at `$DURAFIX_APP_URL` and nothing else; without it they run in a "
        "fresh workspace with no network and no app",
    )


class TestProcedure(_Closed):
    """The tests ``tests`` names (files or test IDs, as the recipe's ``test_subset`` takes them) run on a fresh
    workspace; the bug is present when they fail. With the recipe's ``test_report`` (JUnit XML) the judgement is
    per test: present when at least one test case in the report failed, and a run whose report lists no test
    case could not be completed. Without it, when the command ran and exited non-zero."""

    __test__ = False  # a schema model, not a pytest test class

    version: Literal[1]
    kind: Literal["test"]
    name: Name
    files: Files = Field(default_factory=dict)
    tests: Annotated[list[Annotated[str, Field(min_length=1, max_length=500)]], Field(min_length=1, max_length=50)]
    timeout_s: Annotated[int, Field(ge=1, le=MAX_TEST_TIMEOUT_S)] = DEFAULT_TEST_TIMEOUT_S
    runs: Runs = 1

    @model_validator(mode="after")
    def _plain_tests(self) -> TestProcedure:
        for test in self.tests:
            if test.startswith("-") or any(ord(ch) < 0x20 for ch in test):
                raise ValueError(f"a test is a file or a test ID, not an option or a control character: {test!r}")
        return self


SandboxProcedure: TypeAlias = CommandProcedure | TestProcedure
Reproduction: TypeAlias = Procedure | CommandProcedure | TestProcedure
_MODELS: dict[str, type[BaseModel]] = {
    ReproductionKind.BROWSER: Procedure,
    ReproductionKind.COMMAND: CommandProcedure,
    ReproductionKind.TEST: TestProcedure,
}


def kind_of(reproduction: Reproduction) -> ReproductionKind:
    return ReproductionKind.BROWSER if isinstance(reproduction, Procedure) else ReproductionKind(reproduction.kind)


def needs_app(reproduction: Reproduction) -> bool:
    """Whether ``reproduction``'s own commands run against the provisioned app: a command reproduction with ``app:
    true`` (a browser procedure drives the app through the browser, not commands; a test reproduction never does)."""
    return isinstance(reproduction, CommandProcedure) and reproduction.app


def _model_for(data: dict[str, Any]) -> type[BaseModel]:
    kind = data.get("kind", ReproductionKind.BROWSER)
    if kind not in _MODELS:
        raise ProcedureError(f"kind: must be one of browser, command, test (got {kind!r})")
    if kind == ReproductionKind.BROWSER:
        # A browser procedure's stored form has no kind (as before kinds existed): drop an explicit one.
        data.pop("kind", None)
    return _MODELS[kind]


def describe(reproduction: Reproduction) -> str:
    """The reproduction in a few words a ticket can say: ``the test tests/test_x.py``, ``the command `python3
    repro.py```, ``the browser procedure “name”`` (commands and names cut to 100 characters)."""
    if isinstance(reproduction, TestProcedure):
        tests = ", ".join(reproduction.tests)
        return f"the test{'s' if len(reproduction.tests) > 1 else ''} {_cut(tests)}"
    if isinstance(reproduction, CommandProcedure):
        return f"the command `{_cut(' '.join(reproduction.steps[-1].run.split()))}`"
    return f"the browser procedure “{_cut(reproduction.name)}”"


def _cut(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def parse_reproduction(text: str, first_line: int = 1) -> Reproduction:
    """Validate YAML ``text`` as the reproduction its ``kind`` names (browser when absent); errors
    (:class:`ProcedureError`) carry the line, counted from ``first_line``."""
    found = parse_yaml_model(text, first_line, _model_for)
    assert isinstance(found, Procedure | CommandProcedure | TestProcedure)
    return found


def extract_reproduction(issue_body: str) -> Reproduction | None:
    """The reproduction in ``issue_body``'s ``durafix-repro`` block, or None if there is none; raises
    :class:`ProcedureError` as :func:`browser.procedure.extract_procedure` does."""
    block = find_block(issue_body)
    return None if block is None else parse_reproduction(block[1], block[0])


def stored_form(reproduction: Reproduction) -> bytes:
    """The JSON a reproduction is stored as (a browser procedure's exactly as before kinds existed)."""
    return reproduction.model_dump_json(indent=2).encode()


def load_reproduction(data: bytes) -> Reproduction:
    """A stored reproduction (:func:`stored_form`) read back as its kind's model."""
    raw = json.loads(data)
    model = _MODELS.get(raw.get("kind", ReproductionKind.BROWSER) if isinstance(raw, dict) else "", Procedure)
    found: Reproduction = model.model_validate(raw)  # type: ignore[assignment]
    return found


def to_yaml(reproduction: Reproduction) -> str:
    """The reproduction as the YAML a report's block would hold (defaults left out), e.g. to show a drafted one."""
    import yaml

    data = reproduction.model_dump(mode="json", exclude_defaults=True)
    if isinstance(reproduction, Procedure):
        data = {"version": 1, **data}
    else:
        data = {"version": 1, "kind": reproduction.kind, **data}
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120)
