"""The report's sections for a command or test reproduction: what proves the fix, each command's output on both
revisions side by side, and the procedure.

A command reproduction's proof is its ``bug_present`` checks, each with the value it read on the base revision
and on the candidate commit and whether it held there; the output table shows every command's exit status,
stdout and stderr on both revisions, a row per run and command, the lines a check read marked (``<mark>``)
and the exit status a check read marked too. A test reproduction's proof is the test cases by name, failing
on the base and passing on the candidate (from the recipe's per-test report; without one, the test command's
exit status on each revision). Everything shown comes from untrusted commands and output and is escaped.
"""

from __future__ import annotations

from typing import Any

import yaml

from evidence.bundle import EvidenceBundle, RevisionEvidence
from evidence.interface import ArtifactStore
from evidence.markup import code, esc
from evidence.output_view import Marks, lines_read, show_output
from evidence.procedure_view import as_yaml
from evidence.report_parts import (
    check_row,
    checks_table,
    column_heads,
    link,
    observed_value,
    runs_note,
    verdict_class,
    verdict_table,
)
from evidence.sandbox_runs import CheckRun, CheckSpec, RunRecord, SandboxProcedureView, SandboxRuns, StepRun

_SUBJECTS = {
    "exit_status": "the exit status of the last command",
    "stdout": "the stdout of the last command",
    "stderr": "the stderr of the last command",
}
_COMPARISONS = {"equals": "is", "not_equals": "is not", "contains": "contains", "matches": "matches"}
KIND_TEXT = {"command": "a command", "test": "tests"}
# The name a reproduction the model drafted from the report's prose is stored under (the report carried none):
# the page says so next to the kind, since a reviewer weighs a drafted reproduction differently.
DRAFTED_PROCEDURE_NAME = "drafted-procedure.json"
DRAFTED_TEXT = "drafted by the model from the report's prose, and run on the base until it showed the bug"

# Added to the report's style on a command or test reproduction's page (a browser procedure's page is unchanged).
# Output and commands wrap inside their column rather than widening the table or running over the next column
# (a one-liner has nowhere else to break), and a cell scrolls past a screenful.
STYLE = """
table.outputs{table-layout:fixed}table.outputs th:first-child{width:14%}
table.outputs th code{white-space:pre-wrap;word-break:break-all}
pre.output{white-space:pre-wrap;word-break:break-all;max-height:32rem;margin:.2rem 0}
pre.file-content{white-space:pre-wrap;word-break:break-all}
mark{background:#fff8c5;outline:1px solid #d4a72c}.cut{color:#59636e}
#proof table.tests tr:first-child th:nth-child(1){width:40%}#proof table.tests tr:first-child th:nth-child(2){width:30%}
table.tests code{word-break:break-all}
p.exit{margin:.2rem 0;font-weight:600}p.stream{margin:.5rem 0 0;font-size:12px;color:#59636e}
"""


def _sides(bundle: EvidenceBundle) -> tuple[RevisionEvidence, RevisionEvidence]:
    return bundle.base, bundle.candidate


# ---- what proves the fix -----------------------------------------------------------------------------------


def proof(bundle: EvidenceBundle, kind: str, view: SandboxProcedureView | None, runs: dict[str, SandboxRuns]) -> str:
    """The ``#proof`` section: the checks (a command) or the test cases (tests) on both revisions."""
    if kind == "test":
        return _test_proof(bundle, view, runs)
    head = (
        '<section id="proof"><h2>What proves the fix</h2>'
        '<p id="reproduced-with">Reproduced with <strong>a command</strong>: the procedure\'s commands ran in the '
        "sandbox on each revision, and the bug is present when <strong>every</strong> check below holds for what "
        "the last command left, so a check that holds is a sign of the bug. On the base revision every check "
        "must hold; on the candidate commit at least one must not. Each cell shows the value the check read, "
        "whether it held, and in which runs; the output it read is marked in the outputs below.</p>"
    )
    specs = view.bug_present if view is not None else []
    recorded = {c.index for r in runs.values() if r.record for run in r.record.runs for c in run.checks}
    indices = sorted({*range(len(specs)), *recorded})
    if not indices:
        return f'{head}<p class="note">the procedure names no checks and no record holds any.</p></section>'
    rows = []
    for index in indices:
        if index < len(specs):
            subject, condition = _check_parts(specs[index])
        else:
            subject, condition = code(_description(runs, index) or f"check {index + 1}"), ""
        cells = "".join(_check_cell(side, runs[side.role], index) for side in _sides(bundle))
        rows.append(check_row(index, subject, condition, cells))
    return checks_table(head, _sides(bundle), rows)


def _check_parts(spec: CheckSpec) -> tuple[str, str]:
    """(what the check reads, what it expects there), both HTML."""
    if spec.check == "file":
        subject = f"the file {code(spec.path or '')} the last command left"
    else:
        subject = _SUBJECTS.get(spec.check, code(spec.check))
    comparison = spec.comparison
    if comparison is None:
        return subject, ""
    how, operand = comparison
    return subject, f"{_COMPARISONS.get(how, esc(how))} {code(operand)}"


def _description(runs: dict[str, SandboxRuns], index: int) -> str:
    for side in runs.values():
        for run in side.record.runs if side.record else []:
            for check in run.checks:
                if check.index == index and check.description:
                    return check.description
    return ""


def _check_cell(side: RevisionEvidence, runs: SandboxRuns, index: int) -> str:
    attributes = f'class="observed-cell" data-role="{side.role}" data-check="{index + 1}"'
    if runs.record is None:
        return f'<td {attributes}><p class="note">{esc(runs.note or "not recorded")}</p></td>'
    if not runs.record.runs:
        return f'<td {attributes}><p class="note">no run was made</p></td>'
    several = len(runs.record.runs) > 1
    groups: dict[tuple[bool | None, str | None, str | None, bool], list[tuple[RunRecord, CheckRun]]] = {}
    for run in sorted(runs.record.runs, key=lambda r: r.run):
        check = next((c for c in run.checks if c.index == index), None)
        if check is None:
            why = f"not evaluated: {run.error or 'no check was reached'}"
            check = CheckRun(index=index, holds=None, error=why)
        key = (check.holds, check.actual, check.error, run.bug_present)
        groups.setdefault(key, []).append((run, check))
    entries = "".join(_check_entry(side, seen, several) for seen in groups.values())
    return f"<td {attributes}>{entries}</td>"


def _check_entry(side: RevisionEvidence, seen: list[tuple[RunRecord, CheckRun]], several: bool) -> str:
    run, check = seen[0]
    cls = verdict_class(side.role, check.holds, run.bug_present)
    verdict = {True: "held", False: "did not hold", None: "could not be read"}[check.holds]
    which = runs_note([r.run for r, _ in seen], several)
    error = f'<p class="note">{esc(check.error)}</p>' if check.error else ""
    last = len(run.steps)
    output = ""
    if last and check.holds is not None:
        output = f' <a href="#output-run-{run.run}-command-{last}">the output</a>'
    shown = f'{observed_value(check.actual, "the record")} <span class="verdict {cls}">{verdict}</span>'
    return f'<div class="seen">{shown}{which}{output}{error}</div>'


def _test_proof(bundle: EvidenceBundle, view: SandboxProcedureView | None, runs: dict[str, SandboxRuns]) -> str:
    head = (
        '<section id="proof"><h2>What proves the fix</h2>'
        '<p id="reproduced-with">Reproduced with <strong>tests</strong>: the test command below ran the named '
        "tests in the sandbox on each revision, and the bug is present when they fail. They must fail on the "
        "base revision and pass on the candidate commit.</p>"
    )
    command = next((r.record.command for r in runs.values() if r.record and r.record.command), "")
    parts = [head]
    if command:
        parts.append(f'<p>test command: <code id="test-command">{esc(command)}</code></p>')
    named = view.tests if view is not None else []
    if named:
        parts.append("<p>the tests it names:</p><ul>" + "".join(f"<li>{code(t)}</li>" for t in named) + "</ul>")
    outcomes = {side.role: _case_outcomes(runs[side.role]) for side in _sides(bundle)}
    cases = list(dict.fromkeys(name for by_case in outcomes.values() for name in by_case))
    if cases:
        base, candidate = outcomes["base"], outcomes["candidate"]
        fixed = [c for c in cases if base.get(c) == {"failed"} and candidate.get(c) == {"passed"}]
        listed = ", ".join(code(c) for c in fixed) if fixed else '<span class="note">none</span>'
        parts.append(f'<p id="fixed-tests">Failing on the base, passing on the candidate: {listed}</p>')
    else:
        parts.append(
            '<p class="note" id="fixed-tests">No per-test report was read (the recipe names no '
            "<code>test_report</code>, or the tests did not run): each revision is judged by the test "
            "command's exit status.</p>"
        )
    rows = [
        f'<tr class="test-case"><th scope="row">{code(case)}</th>'
        + "".join(_case_cell(side.role, outcomes[side.role].get(case)) for side in _sides(bundle))
        + "</tr>"
        for case in cases
    ]
    rows.append(
        '<tr class="test-exit"><th scope="row">the test command\'s exit status</th>'
        + "".join(_exit_cell(side, runs[side.role]) for side in _sides(bundle))
        + "</tr>"
    )
    counts = {side.role: _counts(runs[side.role]) for side in _sides(bundle)}
    if any(counts.values()):
        rows.append(
            '<tr class="test-counts"><th scope="row">test counts</th>'
            + "".join(f"<td>{esc(counts[side.role])}</td>" for side in _sides(bundle))
            + "</tr>"
        )
    table = (
        f'<table class="tests"><tr><th scope="col">test</th>{column_heads(_sides(bundle), expectation=False)}</tr>'
        + "".join(rows)
        + "</table>"
    )
    return "".join(parts) + table + "</section>"


def _case_outcomes(runs: SandboxRuns) -> dict[str, set[str]]:
    """Each reported test case's outcomes over the runs, in the order first reported (failing first)."""
    found: dict[str, set[str]] = {}
    for run in sorted(runs.record.runs, key=lambda r: r.run) if runs.record else []:
        for name in run.failing_tests:
            found.setdefault(name, set()).add("failed")
        for name in run.passing_tests:
            found.setdefault(name, set()).add("passed")
    return found


def _case_cell(role: str, outcomes: set[str] | None) -> str:
    if not outcomes:
        return f'<td data-role="{role}"><span class="verdict neutral">not in the report</span></td>'
    if len(outcomes) > 1:
        return f'<td data-role="{role}"><span class="verdict fail">failed in some runs, passed in others</span></td>'
    (outcome,) = outcomes
    expected = "failed" if role == "base" else "passed"
    cls = "pass" if outcome == expected else "fail"
    return f'<td data-role="{role}"><span class="verdict {cls}">{outcome}</span></td>'


def _exit_cell(side: RevisionEvidence, runs: SandboxRuns) -> str:
    if runs.record is None:
        return f'<td data-role="{side.role}"><p class="note">{esc(runs.note or "not recorded")}</p></td>'
    said = []
    for run in sorted(runs.record.runs, key=lambda r: r.run):
        step = run.steps[0] if run.steps else None
        status = _exit_text(step) if step is not None else "did not run"
        prefix = f"run {run.run}: " if len(runs.record.runs) > 1 else ""
        said.append(f"{prefix}{status}")
    return f'<td data-role="{side.role}">{esc("; ".join(said) or "no run was made")}</td>'


def _counts(runs: SandboxRuns) -> str:
    if runs.record is None:
        return ""
    counts = list(dict.fromkeys(r.test_counts for r in runs.record.runs if r.test_counts))
    return "; ".join(counts)


def _exit_text(step: StepRun) -> str:
    if not step.ran:
        return "did not run"
    if step.timed_out or step.exit_code is None:
        return "stopped at its timeout"
    return f"exit status {step.exit_code}"


# ---- observed vs expected, and each command's output -------------------------------------------------------


def comparison(
    bundle: EvidenceBundle,
    kind: str,
    view: SandboxProcedureView | None,
    runs: dict[str, SandboxRuns],
    store: ArtifactStore,
) -> str:
    """The ``#reproduction`` section: each revision's verdict, then every command's output side by side."""
    verdicts = "".join(
        f'<td class="side" id="side-{side.role}" data-revision="{esc(side.revision)}">'
        f"{verdict_table(side, runs[side.role].note)}</td>"
        for side in _sides(bundle)
    )
    head = (
        '<section id="reproduction"><h2>Observed vs expected</h2>'
        f'<table class="sides"><tr>{column_heads(_sides(bundle), expectation=False)}</tr><tr>{verdicts}</tr></table>'
    )
    numbers = sorted({n for r in runs.values() if r.record for n in r.record.run_numbers})
    commands = _commands(kind, view, runs)
    rows = []
    for number in numbers:
        for index, command in enumerate(commands, start=1):
            cells = "".join(_output_cell(side, runs[side.role], view, number, index, store) for side in _sides(bundle))
            label = f"run {number} · command {index}" if kind == "command" else f"run {number} · the test command"
            rows.append(
                f'<tr id="output-run-{number}-command-{index}"><th scope="row">{esc(label)}<br>{code(command)}</th>'
                f"{cells}</tr>"
            )
    intro = (
        "<h3>What each command wrote</h3>"
        '<p class="note">Exit status, stdout and stderr of every command on both revisions. Marked lines and '
        "exit statuses are what a check read (the mark names the check).</p>"
    )
    if not rows:
        return f'{head}{intro}<p class="note">no run was recorded on either revision</p></section>'
    columns = column_heads(_sides(bundle), expectation=False)
    table = f'<table class="outputs"><tr><th scope="col">command</th>{columns}</tr>'
    return f"{head}{intro}{table}{''.join(rows)}</table></section>"


def _commands(kind: str, view: SandboxProcedureView | None, runs: dict[str, SandboxRuns]) -> list[str]:
    """The commands as the procedure states them (a test reproduction's: the test command), else as recorded."""
    recorded: list[str] = []
    for side in runs.values():
        for run in side.record.runs if side.record else []:
            if len(run.steps) > len(recorded):
                recorded = [s.command for s in run.steps]
    if kind == "command" and view is not None and view.steps:
        stated = [s.run for s in view.steps]
        return stated + recorded[len(stated) :]
    return recorded


def _output_cell(
    side: RevisionEvidence,
    runs: SandboxRuns,
    view: SandboxProcedureView | None,
    number: int,
    index: int,
    store: ArtifactStore,
) -> str:
    attributes = f'class="output-cell" data-role="{side.role}" data-run="{number}" data-command="{index}"'
    if runs.record is None:
        return f'<td {attributes}><p class="note">{esc(runs.note or "not recorded")}</p></td>'
    run = runs.record.run(number)
    if run is None or index > len(run.steps):
        return f'<td {attributes}><p class="note">not run</p></td>'
    step = run.steps[index - 1]
    if not step.ran:
        return f'<td {attributes}><p class="note">did not run (an earlier command did not exit 0)</p></td>'
    first = runs.record.run(min(runs.record.run_numbers))
    if first is not None and _repeats(first, run, index):
        return f'<td {attributes}><p class="note">same as run {first.run}</p></td>'
    read_exit, marks = _marks(run, view, index)
    exit_text = esc(_exit_text(step))
    if read_exit:
        numbers = " ".join(str(n) for n in read_exit)
        exit_text = f'<mark data-check="{numbers}" title="read by check {numbers}">{exit_text}</mark>'
    parts = [f'<p class="exit">{exit_text}</p>']
    for stream, text, cut in (("stdout", step.stdout, step.stdout_cut), ("stderr", step.stderr, step.stderr_cut)):
        shown = show_output(text, marks[stream], stream)
        notes = [shown.left_out] if shown.left_out else []
        if cut:
            notes.append("the command wrote more than the record keeps")
        notes += [f"check {check} read line {line}, beyond those shown" for check, line in shown.unshown_marks]
        whole = ""
        if notes and runs.log is not None:
            whole = f"; the whole {stream} kept is in {link(runs.log, store)}"
        note = f'<p class="note">{esc("; ".join(notes))}{whole}</p>' if notes else ""
        parts.append(f'<p class="stream">{stream}</p>{shown.html}{note}')
    return f"<td {attributes}>{''.join(parts)}</td>"


def _repeats(first: RunRecord, run: RunRecord, index: int) -> bool:
    """Whether command ``index`` of ``run`` did exactly what it did in ``first`` (and the checks read the same),
    so its output need not be shown twice."""
    if first.run == run.run or index > len(first.steps) or first.steps[index - 1] != run.steps[index - 1]:
        return False
    return [(c.holds, c.actual) for c in first.checks] == [(c.holds, c.actual) for c in run.checks]


def _marks(run: RunRecord, view: SandboxProcedureView | None, index: int) -> tuple[list[int], dict[str, Marks]]:
    """What the checks read of command ``index`` (1-based) in ``run``: the check numbers that read its exit
    status, and per stream the lines they read. Checks read only the last command, and only in a run that
    evaluated them."""
    marks = {"stdout": Marks(), "stderr": Marks()}
    read_exit: list[int] = []
    if view is None or index != len(run.steps) or not run.checks:
        return read_exit, marks
    evaluated = {c.index for c in run.checks if c.holds is not None}
    if view.kind == "test":
        # Without a per-test report (no counts), the one check is the test command's exit status.
        return ([1] if evaluated and not run.test_counts else []), marks
    step = run.steps[index - 1]
    for number, spec in enumerate(view.bug_present, start=1):
        if number - 1 not in evaluated:
            continue
        if spec.check == "exit_status":
            read_exit.append(number)
            continue
        comparison = spec.comparison
        if spec.check not in marks or comparison is None:
            continue
        text = step.stdout if spec.check == "stdout" else step.stderr
        for line in lines_read(text, *comparison):
            marks[spec.check].add(line, number)
    return read_exit, marks


# ---- the procedure -----------------------------------------------------------------------------------------


def procedure(
    bundle: EvidenceBundle,
    store: ArtifactStore,
    kind: str,
    view: SandboxProcedureView | None,
    problem: str | None,
    text: str,
    runs: dict[str, SandboxRuns],
) -> str:
    """The ``#steps`` section: the files it writes (their content), its commands or tests, its checks."""
    head = f'<section id="steps"><h2>Reproduction procedure</h2><p>{link(bundle.procedure, store)}</p>'
    if view is None:
        why = f'<p class="note">not shown as a list: {esc(problem)}</p>' if problem else ""
        return f"{head}{why}<pre>{esc(text)}</pre></section>"
    parts = [head, f"<p><strong>{esc(view.name)}</strong> ({KIND_TEXT[kind]})</p>" if view.name else ""]
    if view.files:
        parts.append("<h3>Files it writes before the first command</h3>")
        parts += [
            f'<div class="file"><p>{code(path)}</p><pre class="file-content">{esc(content)}</pre></div>'
            for path, content in view.files.items()
        ]
    if kind == "command":
        items = "".join(
            f"<li>{code(step.run)}"
            + (f' <span class="note">within {step.timeout_s} s</span>' if step.timeout_s is not None else "")
            + "</li>"
            for step in view.steps
        )
        parts.append(
            "<h3>Commands</h3>"
            '<p class="note">each run by <code>/bin/sh -c</code> in the sandbox, stdin empty; every one before the '
            "last must exit 0</p>"
            f'<ol class="commands">{items}</ol>'
        )
        checks = "".join(f"<li>{' '.join(p for p in _check_parts(c) if p)}</li>" for c in view.bug_present)
        if checks:
            parts.append(f'<h3>The bug is present when all of these hold</h3><ol class="checks">{checks}</ol>')
    else:
        tests = "".join(f"<li>{code(t)}</li>" for t in view.tests)
        command = next((r.record.command for r in runs.values() if r.record and r.record.command), "")
        within = f' <span class="note">within {view.timeout_s} s</span>' if view.timeout_s is not None else ""
        run_by = f"<p>run by the recipe's <code>test_subset</code>: {code(command)}{within}</p>" if command else ""
        parts.append(f'<h3>Tests</h3><ol class="tests">{tests}</ol>{run_by}')
        parts.append("<p>The bug is present when these tests fail.</p>")
    if view.runs > 1:
        parts.append(f'<p class="note">Run {view.runs} times; runs that disagree are inconclusive.</p>')
    parts.append(f"<details><summary>as YAML</summary><pre>{esc(_as_yaml(text))}</pre></details>")
    return "".join(parts) + "</section>"


def _as_yaml(text: str) -> str:
    try:
        loaded: Any = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return as_yaml(loaded) if isinstance(loaded, dict) else text
