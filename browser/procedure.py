"""The reproduction procedure a bug report carries: a validated, versioned list of browser steps and the
assertions that, all holding, mean the bug is present.

A report embeds the procedure as YAML in a fenced code block tagged ``durafix-repro``. The text comes from
an untrusted issue body, so the schema is closed (unknown keys are errors), navigation is confined to paths
under the environment's base URL, and every regular expression is compiled at validation time by the
linear-time engine that later evaluates it (:mod:`browser.patterns`: RE2; a pattern it cannot evaluate, such
as one with a backreference or a lookaround, is refused here, saying which syntax). The report and the
procedure are length-capped, and finding the block is linear in the report's length (no backtracking regex
reads it), so no report can stall a worker.

``procedure_digest`` is a pure function of the validated procedure (defaults included), so two reports that
spell the same procedure differently share a digest and a stored procedure can be checked against its
recorded digest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeAlias, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from browser.patterns import MAX_PATTERN_CHARS, validate_pattern

FENCE_TAG = "durafix-repro"
MAX_PROCEDURE_CHARS = 64_000
# GitHub caps an issue body at 65,536 characters; a longer report is not from GitHub and is refused.
MAX_REPORT_CHARS = 256_000
DEFAULT_TIMEOUT_MS = 5_000
MAX_TIMEOUT_MS = 60_000
MAX_RUNS = 10


class ProcedureError(ValueError):
    """The procedure is unusable; ``line`` is the 1-based line of the offending text in the source, if known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        self.message = message
        self.line = line
        super().__init__(f"line {line}: {message}" if line is not None else message)


def _relative_path(path: str) -> str:
    # A report must not steer the browser to another host: only paths under the base URL are allowed.
    if not path.startswith("/") or path.startswith("//"):
        raise ValueError(f"path must start with a single '/' (relative to the app's base URL), got {path!r}")
    return path


Selector = Annotated[str, Field(min_length=1, max_length=500)]
Timeout = Annotated[int, Field(ge=1, le=MAX_TIMEOUT_MS)]
Pattern = Annotated[str, Field(max_length=MAX_PATTERN_CHARS), AfterValidator(validate_pattern)]
RelativePath = Annotated[str, Field(max_length=2_000), AfterValidator(_relative_path)]


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    action: str

    def describe(self) -> str:
        """One line a human can read in a log or a heartbeat, e.g. ``click #checkout``."""
        fields = self.model_dump(exclude={"action", "timeout_ms"}, exclude_none=True)
        return " ".join([self.action, *(f"{k}={v!r}" for k, v in fields.items())])


class Goto(_Shape):
    action: Literal["goto"]
    path: RelativePath = "/"
    timeout_ms: Timeout = 15_000


class Click(_Shape):
    action: Literal["click"]
    selector: Selector
    timeout_ms: Timeout = DEFAULT_TIMEOUT_MS


class Fill(_Shape):
    action: Literal["fill"]
    selector: Selector
    value: str
    timeout_ms: Timeout = DEFAULT_TIMEOUT_MS


class Press(_Shape):
    action: Literal["press"]
    selector: Selector
    key: Annotated[str, Field(min_length=1, max_length=100)]
    timeout_ms: Timeout = DEFAULT_TIMEOUT_MS


class Select(_Shape):
    action: Literal["select"]
    selector: Selector
    value: str
    timeout_ms: Timeout = DEFAULT_TIMEOUT_MS


class WaitFor(_Shape):
    action: Literal["wait_for"]
    selector: Selector
    state: Literal["attached", "detached", "visible", "hidden"] = "visible"
    timeout_ms: Timeout = DEFAULT_TIMEOUT_MS


class ExpectText(_Shape):
    """The element's visible text (as rendered, whitespace collapsed) compared in exactly one way."""

    action: Literal["expect_text"]
    selector: Selector
    equals: str | None = None
    not_equals: str | None = None
    contains: str | None = None
    matches: Pattern | None = None
    timeout_ms: Timeout = DEFAULT_TIMEOUT_MS

    @model_validator(mode="after")
    def _exactly_one_comparison(self) -> ExpectText:
        given = [k for k in ("equals", "not_equals", "contains", "matches") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"expect_text needs exactly one of equals, not_equals, contains, matches (got {given})")
        return self


class ExpectVisible(_Shape):
    action: Literal["expect_visible"]
    selector: Selector
    timeout_ms: Timeout = DEFAULT_TIMEOUT_MS


class ExpectUrl(_Shape):
    """``matches`` is searched in the page URL's path, query and fragment (the base URL differs per run)."""

    action: Literal["expect_url"]
    matches: Pattern
    timeout_ms: Timeout = DEFAULT_TIMEOUT_MS


class ExpectResponseStatus(_Shape):
    """The latest response the page received for ``path`` (path plus query, if given) had ``status``."""

    action: Literal["expect_response_status"]
    path: RelativePath
    status: Annotated[int, Field(ge=100, le=599)]
    timeout_ms: Timeout = DEFAULT_TIMEOUT_MS


Expectation: TypeAlias = ExpectText | ExpectVisible | ExpectUrl | ExpectResponseStatus
EXPECTATIONS = (ExpectText, ExpectVisible, ExpectUrl, ExpectResponseStatus)
Assertion = Annotated[Expectation, Field(discriminator="action")]
Step = Annotated[
    Goto | Click | Fill | Press | Select | WaitFor | ExpectText | ExpectVisible | ExpectUrl | ExpectResponseStatus,
    Field(discriminator="action"),
]


class Procedure(BaseModel):
    """Steps bring a fresh page to the state where the bug shows; the bug is present when ALL of
    ``bug_present`` hold there. ``runs`` > 1 repeats the whole procedure to detect a flaky result."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1]
    name: Annotated[str, Field(min_length=1, max_length=200)]
    steps: Annotated[list[Step], Field(min_length=1, max_length=100)]
    bug_present: Annotated[list[Assertion], Field(min_length=1, max_length=50)]
    runs: Annotated[int, Field(ge=1, le=MAX_RUNS)] = 1


def procedure_digest(procedure: Procedure) -> str:
    """sha256 (hex) of the procedure's canonical JSON: defaults included, keys sorted, no whitespace."""
    canonical = json.dumps(procedure.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def parse_procedure(text: str, first_line: int = 1) -> Procedure:
    """Validate YAML ``text``; errors carry the line, counted from ``first_line`` for the text's first line."""
    return parse_yaml_model(text, first_line, lambda _data: Procedure)


ModelT = TypeVar("ModelT", bound=BaseModel)


def parse_yaml_model(text: str, first_line: int, model_for: Callable[[dict[str, Any]], type[ModelT]]) -> ModelT:
    """Validate YAML ``text`` (a mapping) as the model ``model_for`` picks for it; errors (:class:`ProcedureError`)
    carry the line, counted from ``first_line``. The caps and the error shape of every reproduction kind."""
    if len(text) > MAX_PROCEDURE_CHARS:
        raise ProcedureError(f"procedure is longer than {MAX_PROCEDURE_CHARS} characters", first_line)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = first_line + mark.line if mark is not None else first_line
        raise ProcedureError(f"invalid YAML: {err.problem or err.context}", line) from err
    except yaml.YAMLError as err:
        raise ProcedureError(f"invalid YAML: {err}", first_line) from err
    if not isinstance(data, dict):
        raise ProcedureError("the procedure must be a YAML mapping (version, name, steps, bug_present)", first_line)
    try:
        return model_for(data).model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "procedure"
        more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
        line = first_line + _node_line(node, first["loc"]) if node is not None else first_line
        raise ProcedureError(f"{where}: {first['msg']}{more}", line) from err


def extract_procedure(issue_body: str) -> Procedure | None:
    """The procedure in ``issue_body``'s fenced ``durafix-repro`` block, or None if there is none.

    Raises ProcedureError (with the line in the body) when the body is longer than
    :data:`MAX_REPORT_CHARS`, or the block is unterminated, appears more than once, or does not hold a
    valid procedure.
    """
    block = find_block(issue_body)
    return None if block is None else parse_procedure(block[1], block[0])


def find_block(issue_body: str) -> tuple[int, str] | None:
    """The text of ``issue_body``'s one fenced ``durafix-repro`` block and the body's line its text starts on,
    or None if there is none. Raises ProcedureError when the body is longer than :data:`MAX_REPORT_CHARS`, or
    the block is unterminated or appears more than once."""
    if len(issue_body) > MAX_REPORT_CHARS:
        raise ProcedureError(f"the report is longer than {MAX_REPORT_CHARS} characters")
    lines = issue_body.splitlines()
    blocks: list[tuple[int, list[str]]] = []
    i = 0
    while i < len(lines):
        opened = _fence_open(lines[i])
        if opened is None:
            i += 1
            continue
        fence, info = opened
        end = next((j for j in range(i + 1, len(lines)) if _fence_closes(lines[j], fence)), None)
        if info.split()[:1] == [FENCE_TAG]:
            if end is None:
                raise ProcedureError(f"the {FENCE_TAG} block is never closed", i + 1)
            blocks.append((i + 2, lines[i + 1 : end]))
        i = len(lines) if end is None else end + 1
    if not blocks:
        return None
    if len(blocks) > 1:
        raise ProcedureError(f"more than one {FENCE_TAG} block; keep exactly one", blocks[1][0] - 1)
    first_line, body = blocks[0]
    return first_line, "\n".join(body)


def _fence_open(line: str) -> tuple[str, str] | None:
    """``(fence, info)`` when ``line`` opens a fenced code block (CommonMark: up to 3 spaces of indent, 3 or
    more backticks or tildes, an info string without backticks), else None. One pass over the line."""
    body = line.lstrip(" ")
    if len(line) - len(body) > 3 or body[:1] not in ("`", "~"):
        return None
    char = body[0]
    run = len(body) - len(body.lstrip(char))
    if run < 3:
        return None
    info = body[run:]
    if "`" in info:
        return None
    return body[:run], info.strip()


def _fence_closes(line: str, fence: str) -> bool:
    """Whether ``line`` closes a block opened by ``fence``: indent up to 3 spaces, at least as many of the
    same character, then only whitespace."""
    body = line.lstrip(" ")
    if len(line) - len(body) > 3:
        return False
    mark = body.rstrip()
    return len(mark) >= len(fence) and mark == fence[0] * len(mark)


def _node_line(node: yaml.Node, loc: tuple[int | str, ...]) -> int:
    """0-based line of the deepest YAML node that ``loc`` (a pydantic error location) reaches."""
    for part in loc:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            child = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
            if child is None and _mapping_action(node) == part:
                # pydantic puts the union tag (the step's action) in the location; it is not a YAML key.
                continue
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            child = node.value[part]
        if child is None:
            break
        node = child
    line: int = node.start_mark.line
    return line


def _mapping_action(node: yaml.MappingNode) -> Any:
    return next((v.value for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == "action"), None)
