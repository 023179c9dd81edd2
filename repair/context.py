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

The reproduction log is read as ``docs/browser.md`` documents it; a field of the wrong type is absent. A command
or test reproduction (:func:`sandbox_reproduction_context`) is told as the report's YAML (fenced, redacted, capped)
with each check's readings and each run's last command (its exit status and the ends of its outputs, quoted), and
the tests that failed.
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
MAX_PROCEDURE_YAML_CHARS = 6_000
MAX_OUTPUT_CHARS = 1_000
MAX_RUNS_SHOWN = 5
MAX_TESTS_SHOWN = 20
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


class CommandSeen(_Value):
    """One run of a command or test reproduction: its last command as it ended, and the tests that failed."""

    run: int
    command: str
    exit_code: int | None = None
    timed_out: bool = False
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    failing_tests: list[str] = Field(default_factory=list)


class ReproductionContext(_Value):
    """The base revision's reproduction: its verdict, the page it ended on, the checks, what the page logged.
    A command or test reproduction (``kind``) has no page: its YAML and its runs' commands instead."""

    revision: str
    status: str
    page: str | None = None
    checks: list[CheckFact] = Field(default_factory=list)
    console_errors: list[str] = Field(default_factory=list)
    failed_requests: list[str] = Field(default_factory=list)
    note: str | None = None
    kind: str = "browser"
    procedure_yaml: str | None = None
    runs: list[CommandSeen] = Field(default_factory=list)
    # A command reproduction that ran against the running app (``app: true``).
    app: bool = False


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


def sandbox_reproduction_context(
    *,
    revision: str,
    status: str,
    kind: str,
    procedure_yaml: str | None,
    record: object,
    redact: Redact,
    app: bool = False,
) -> ReproductionContext:
    """A command or test reproduction's facts: ``procedure_yaml`` (:func:`environments.reproduction.to_yaml`; None
    when the stored reproduction could not be read) and its stored record (the parsed
    :class:`environments.command_repro.SandboxReproduction` JSON: any JSON value; one that is not gives no runs
    and a note)."""
    notes = []
    if procedure_yaml is None:
        notes.append("the stored reproduction could not be read")
    document = record if isinstance(record, dict) else {}
    runs = document.get("runs")
    if not isinstance(runs, list):
        notes.append("the reproduction's record could not be read")
        runs = []
    checks: dict[int, tuple[str, list[CheckSeen]]] = {}
    seen_runs: list[CommandSeen] = []
    for entry in runs:
        if not isinstance(entry, dict) or not isinstance(entry.get("run"), int):
            continue
        number = entry["run"]
        for check in _list(entry.get("checks")):
            if not isinstance(check, dict) or not isinstance(check.get("index"), int):
                continue
            _, readings = checks.setdefault(check["index"], (_text(check.get("description")) or "?", []))
            holds = check.get("holds")
            readings.append(
                CheckSeen(
                    run=number,
                    holds=holds if isinstance(holds, bool) else None,
                    observed=clean(actual, redact) if (actual := _text(check.get("actual"))) is not None else None,
                    error=clean(error, redact) if (error := _text(check.get("error"))) is not None else None,
                )
            )
        if len(seen_runs) < MAX_RUNS_SHOWN:
            seen_runs.append(_command_seen(number, entry, redact))
    if len(runs) > MAX_RUNS_SHOWN:
        notes.append(f"{len(runs) - MAX_RUNS_SHOWN} more runs not shown")
    facts = [
        CheckFact(number=index + 1, expected=clean(description, redact), seen=readings)
        for index, (description, readings) in sorted(checks.items())[:MAX_CHECKS]
    ]
    text = clean(procedure_yaml, redact, MAX_PROCEDURE_YAML_CHARS) if procedure_yaml is not None else None
    return ReproductionContext(
        revision=revision,
        status=status,
        checks=facts,
        note=clean("; ".join(notes), redact) if notes else None,
        kind=kind,
        procedure_yaml=text,
        runs=seen_runs,
        app=app,
    )


def _command_seen(number: int, entry: Mapping[str, Any], redact: Redact) -> CommandSeen:
    """Run ``number``'s last command that ran, with the ends of its outputs (where a traceback or a test
    runner's summary is)."""
    ran = [s for s in _list(entry.get("steps")) if isinstance(s, dict) and s.get("ran", True)]
    last: Mapping[str, Any] = ran[-1] if ran else {}
    exit_code = last.get("exit_code")
    failing = _list(entry.get("failing_tests"))
    return CommandSeen(
        run=number,
        command=clean(_text(last.get("command")) or "", redact),
        exit_code=exit_code if isinstance(exit_code, int) else None,
        timed_out=last.get("timed_out") is True,
        stdout=_tail(_text(last.get("stdout")) or "", redact),
        stderr=_tail(_text(last.get("stderr")) or "", redact),
        error=clean(error, redact) if (error := _text(entry.get("error"))) is not None else None,
        failing_tests=[clean(t, redact) for t in failing[:MAX_TESTS_SHOWN] if isinstance(t, str)],
    )


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _tail(text: str, redact: Redact) -> str:
    """The last :data:`MAX_OUTPUT_CHARS` of ``text``, redacted first (a test runner ends with what failed)."""
    text = redact(text).encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= MAX_OUTPUT_CHARS:
        return text
    return f"[{len(text) - MAX_OUTPUT_CHARS} earlier characters cut] ...{text[-MAX_OUTPUT_CHARS:]}"


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
    if r.kind != "browser":
        return _sandbox_reproduction(r)
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


_SANDBOX_KINDS = {
    "command": (
        "a command reproduction: its commands run one after another in the sandbox on a fresh workspace (the "
        "recipe's setup done, no network, no app); the bug is present when every check below holds for the last "
        "command. After a fix at least one must not hold."
    ),
    "command-app": (
        "a command reproduction against the running app: its commands run one after another in the sandbox, in "
        "the environment provisioned for the revision (the recipe's setup done, the app started and ready), with "
        "the app's address in $DURAFIX_APP_URL and nothing but the app reachable; the bug is present when every "
        "check below holds for the last command. After a fix at least one must not hold."
    ),
    "test": (
        "a test reproduction: the tests it names run with the repository's test_subset command in the sandbox; "
        "the bug is present when they fail. After a fix they must pass (and the whole test suite too)."
    ),
}


def _sandbox_reproduction(r: ReproductionContext) -> str:
    lines = [
        f"Reproduction on the base revision {r.revision[:12]}: {r.status}.",
        f"It is {_SANDBOX_KINDS.get(f'{r.kind}-app' if r.app else r.kind, r.kind)}",
    ]
    if r.procedure_yaml is not None:
        # A fence longer than any run of backticks in the text, so the text cannot end it.
        fence = "`" * max(3, _longest_backticks(r.procedure_yaml) + 1)
        lines += ["The reproduction as the report gives it:", f"{fence}yaml", r.procedure_yaml.rstrip("\n"), fence]
    for check in r.checks:
        lines.append(f"- check {check.number}: expected while the bug is present: {check.expected}")
        lines += [f"  {line}" for line in _observed(check.seen)]
    for run in r.runs:
        ended = "stopped at its timeout" if run.timed_out else f"exit {run.exit_code}"
        lines.append(f"Run {run.run}, last command {_quoted(run.command)}: {ended}")
        lines.append(f"  stdout (end): {_quoted(run.stdout)}")
        lines.append(f"  stderr (end): {_quoted(run.stderr)}")
        if run.failing_tests:
            lines.append(f"  failing tests: {', '.join(_quoted(t) for t in run.failing_tests)}")
        if run.error is not None:
            lines.append(f"  the run could not be completed: {_quoted(run.error)}")
    if r.note:
        lines.append(f"Note: {r.note}")
    return "\n".join(lines)


def _longest_backticks(text: str) -> int:
    longest = run = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return longest


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
