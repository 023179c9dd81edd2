"""What a repair attempt's first message tells the model beyond the report: the run's durable facts.

A :class:`RepairContext` holds the reproduction on the base revision (each ``bug_present`` check with what
the procedure expects and what the page showed, the page's console errors and failed requests), the
recipe's test command and the baseline's result, and every earlier attempt with its patch summary and why
verification refused it. :meth:`RepairContext.render` turns it into prompt text; it is a pure function of
the value, so a first turn sent again after a crash sends the very bytes the first try sent.

What the page showed is untrusted input to the model. The builders here (:func:`reproduction_context`,
:func:`earlier_attempt`, :func:`clean`) therefore pass every text through the caller's redaction first
(the secrets known on the host) and only then cut it to :data:`MAX_VALUE_CHARS` (cutting first could split
a secret so redaction no longer finds it); lists are capped; rendering quotes each value as a JSON string,
so a page cannot fake a line of the message. The models hold values as the builders made them.

The reproduction log is read as ``docs/browser.md`` documents it; a field of the wrong type is absent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evidence.observations import CheckObservation, observations_in

Redact = Callable[[str], str]

MAX_VALUE_CHARS = 300
MAX_CHECKS = 20
MAX_PROBLEMS = 10
_TEXT_COMPARISONS = {"equals": "is", "not_equals": "is not", "contains": "contains", "matches": "matches the pattern"}


def clean(text: str, redact: Redact, limit: int = MAX_VALUE_CHARS) -> str:
    """``text`` redacted, then cut to ``limit`` characters (saying how many were cut). Text that UTF-8 cannot
    encode (a lone surrogate from a page) is escaped, so the transcript can always be stored."""
    text = redact(text).encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters cut]"


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CheckSeen(_Value):
    """One run's reading of one check: the page's value, whether the check held (None: not evaluated)."""

    run: int
    holds: bool | None
    observed: str | None = None
    error: str | None = None


class CheckFact(_Value):
    """A ``bug_present`` check: ``expected`` is what holds on the page while the bug is present."""

    number: int
    expected: str
    seen: list[CheckSeen] = Field(default_factory=list)


class ReproductionContext(_Value):
    """The base revision's reproduction: its verdict, the page it ended on, the checks, what the page logged."""

    revision: str
    status: str
    page: str | None = None
    checks: list[CheckFact] = Field(default_factory=list)
    console_errors: list[str] = Field(default_factory=list)
    failed_requests: list[str] = Field(default_factory=list)
    note: str | None = None


class EarlierAttempt(_Value):
    """An attempt verification refused: its patch summary (empty when it gave no patch) and the reason."""

    attempt: int
    summary: str = ""
    reason: str

    def line(self) -> str:
        """The attempt as one line of a run's outcome (the form runs recorded it in before it was structured)."""
        return f"attempt {self.attempt}: {self.reason}"


class RepairContext(_Value):
    reproduction: ReproductionContext | None = None
    test_command: str | None = None
    baseline: str | None = None
    earlier_attempts: list[EarlierAttempt] = Field(default_factory=list)
    # The reproduction's tests already in the workspace (written on the base before the attempt).
    seed_tests: list[str] = Field(default_factory=list)

    def render(self) -> str:
        """The context as the sections of the first user message, after the report; empty when it holds nothing."""
        parts = (
            _reproduction(self.reproduction),
            _seeded(self.seed_tests),
            _tests(self.test_command, self.baseline),
            _earlier(self),
        )
        sections = [s for s in parts if s]
        return "\n\n".join(sections)


def reproduction_context(
    *,
    revision: str,
    status: str,
    procedure: Mapping[str, Any] | None,
    log: object,
    redact: Redact,
) -> ReproductionContext:
    """The reproduction's facts from its stored procedure (a mapping, as the runner stores it) and its parsed
    ``log.json`` (any JSON value: a log that is not one gives checks without observations and a note)."""
    checks_spec = procedure.get("bug_present") if procedure is not None else None
    checks_spec = checks_spec if isinstance(checks_spec, list) else []
    observations = observations_in(log)
    notes = []
    if procedure is None:
        notes.append("the stored procedure could not be read")
    if observations is None:
        notes.append("the reproduction log could not be read")
    elif observations.note:
        notes.append(observations.note)
    indices = sorted({*range(len(checks_spec)), *(observations.checks if observations else {})})
    checks = [
        CheckFact(
            number=index + 1,
            expected=clean(_expectation(checks_spec[index] if index < len(checks_spec) else None), redact),
            seen=[_seen(o, redact) for o in observations.for_check(index)] if observations else [],
        )
        for index in indices[:MAX_CHECKS]
    ]
    if len(indices) > MAX_CHECKS:
        notes.append(f"{len(indices) - MAX_CHECKS} more checks not shown")
    console, failed = _page_problems(log)
    return ReproductionContext(
        revision=revision,
        status=status,
        page=clean(page, redact) if (page := _last_goto(procedure)) is not None else None,
        checks=checks,
        console_errors=[clean(line, redact) for line in console],
        failed_requests=[clean(line, redact) for line in failed],
        note=clean("; ".join(notes), redact) if notes else None,
    )


def earlier_attempt(attempt: int, summary: str, reason: str, redact: Redact) -> EarlierAttempt:
    """An earlier attempt with its summary (the model's words) and reason (verification's) made safe to show."""
    return EarlierAttempt(attempt=attempt, summary=clean(summary, redact), reason=clean(reason, redact))


def _expectation(check: object) -> str:
    """What a ``bug_present`` check says of the page, as a sentence (unknown fields as ``field=value``)."""
    if not isinstance(check, dict):
        return "(the procedure holds no such check)"
    fields = {k: v for k, v in check.items() if v is not None and k != "timeout_ms"}
    action = fields.pop("action", None)
    selector = fields.pop("selector", None)
    if action == "expect_text":
        compared = [(k, fields.pop(k)) for k in list(_TEXT_COMPARISONS) if k in fields]
        said = " and ".join(f"{_TEXT_COMPARISONS[k]} {_quoted(v)}" for k, v in compared)
        sentence = f"the text of {_quoted(selector)} {said}"
    elif action == "expect_visible":
        sentence = f"{_quoted(selector)} is visible"
    elif action == "expect_url":
        sentence = f"the page URL matches the pattern {_quoted(fields.pop('matches', None))}"
    elif action == "expect_response_status":
        path, status = fields.pop("path", None), fields.pop("status", None)
        sentence = f"the latest response for {_quoted(path)} has status {_quoted(status)}"
    else:
        sentence = f"{_quoted(action)}" + (f" on {_quoted(selector)}" if selector is not None else "")
    extra = ", ".join(f"{k}={_quoted(v)}" for k, v in fields.items())
    return f"{sentence} ({extra})" if extra else sentence


def _seen(observation: CheckObservation, redact: Redact) -> CheckSeen:
    return CheckSeen(
        run=observation.run,
        holds=observation.holds,
        observed=clean(observation.actual, redact) if observation.actual is not None else None,
        error=clean(observation.error, redact) if observation.error is not None else None,
    )


def _last_goto(procedure: Mapping[str, Any] | None) -> str | None:
    """The path of the procedure's last ``goto``: the page its checks read (the runner records no later URL)."""
    steps = procedure.get("steps") if procedure is not None else None
    paths = (
        [s.get("path", "/") for s in steps if isinstance(s, dict) and s.get("action") == "goto"]
        if isinstance(steps, list)
        else []
    )
    last = paths[-1] if paths else None
    return last if isinstance(last, str) else None


def _page_problems(log: object) -> tuple[list[str], list[str]]:
    """The distinct console errors and page errors, and the distinct failed or erroring requests, of every run
    of ``log`` in order (at most :data:`MAX_PROBLEMS` of each); URLs under the app's base URL are shown as
    paths (the base URL's port differs per environment)."""
    console: list[str] = []
    failed: list[str] = []
    document = log if isinstance(log, dict) else {}
    runs, base_url = document.get("runs"), _text(document.get("base_url")) or ""
    runs = runs if isinstance(runs, list) else []
    for run in runs:
        events = run.get("events") if isinstance(run, dict) else None
        for event in events if isinstance(events, list) else []:
            if not isinstance(event, dict):
                continue
            kind = event.get("kind")
            if kind == "console" and event.get("level") == "error":
                _add(console, _text(event.get("text")))
            elif kind == "pageerror":
                _add(console, _text(event.get("message")))
            elif kind == "requestfailed":
                why = _text(event.get("failure"))
                _add(failed, f"{_request(event, base_url)}: {why or 'failed'}")
            elif kind == "response" and isinstance(event.get("status"), int):
                _add(failed, f"{_request(event, base_url)}: status {event['status']}")
    return console, failed


def _add(into: list[str], line: str | None) -> None:
    if line and line not in into and len(into) < MAX_PROBLEMS:
        into.append(line)


def _request(event: Mapping[str, Any], base_url: str) -> str:
    url = _text(event.get("url")) or "?"
    root = base_url.rstrip("/")
    if root and (url == root or url.startswith(root + "/")):
        url = url[len(root) :] or "/"
    return f"{_text(event.get('method')) or 'GET'} {url}"


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _quoted(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


# ---- rendering ----------------------------------------------------------------------------------------------


def _reproduction(r: ReproductionContext | None) -> str:
    if r is None:
        return ""
    lines = [
        f"Reproduction on the base revision {r.revision[:12]}: {r.status}.",
        "The bug is present when every check below holds on the page; after a fix at least one must not hold.",
    ]
    if r.page is not None:
        lines.append(f"Page (the procedure's last goto, under the app's base URL): {_quoted(r.page)}")
    for check in r.checks:
        lines.append(f"- check {check.number}: expected while the bug is present: {check.expected}")
        lines += [f"  {line}" for line in _observed(check.seen)]
    if r.console_errors:
        lines.append("Console errors on the page:")
        lines += [f"- {_quoted(e)}" for e in r.console_errors]
    if r.failed_requests:
        lines.append("Failed requests:")
        lines += [f"- {_quoted(e)}" for e in r.failed_requests]
    if r.note:
        lines.append(f"Note: {r.note}")
    return "\n".join(lines)


def _observed(seen: list[CheckSeen]) -> list[str]:
    """One line per distinct reading, naming the runs that saw it."""
    groups: dict[tuple[bool | None, str | None, str | None], list[int]] = {}
    for s in seen:
        groups.setdefault((s.holds, s.observed, s.error), []).append(s.run)
    lines = []
    for (holds, observed, error), runs in groups.items():
        where = f"run{'s' if len(runs) > 1 else ''} {', '.join(map(str, runs))}"
        verdict = {True: "held", False: "did not hold", None: "not evaluated"}[holds]
        value = f"observed {_quoted(observed)}" if observed is not None else "observed nothing"
        why = f"; error: {_quoted(error)}" if error is not None else ""
        lines.append(f"{value}: {verdict} ({where}){why}")
    return lines or ["observed nothing: no run of the log evaluated it"]


def _tests(command: str | None, baseline: str | None) -> str:
    lines = []
    if command is not None:
        lines.append(f"The repository's test command (durafix runs it after you finish): {_quoted(command)}")
    if baseline is not None:
        lines.append(f"Its result on the base revision: {_quoted(baseline)}")
    return "\n".join(lines)


def _seeded(tests: list[str]) -> str:
    if not tests:
        return ""
    named = ", ".join(_quoted(t) for t in tests)
    return (
        f"The test reproducing the bug is already in your workspace: {named}. It fails now; it must pass after "
        "your fix. Keep it (do not delete or weaken it): it becomes the regression test of your change."
    )


def _earlier(context: RepairContext) -> str:
    if not context.earlier_attempts:
        return ""
    lines = ["Earlier attempts were refused by verification; do not repeat them:"]
    for a in context.earlier_attempts:
        summary = _quoted(a.summary) if a.summary else "(no patch)"
        lines.append(f"- attempt {a.attempt}: patch summary {summary}; refused because: {_quoted(a.reason)}")
    return "\n".join(lines)
