"""The reviewer's report for command and test reproductions: the checks and the tests on both revisions, each
command's output side by side with what a check read marked, hostile and huge output, unreadable records, and
a real reproduction run in the sandbox on buggy and fixed code, rendered and opened in Chromium."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import pytest
from playwright.sync_api import Browser

from browser.results import AssertionOutcome, ReproductionStatus
from environments.checks import run_tests
from environments.command_repro import (
    CommandRunRecord,
    SandboxReproduction,
    StepRecord,
    reproduce_in_sandbox,
)
from environments.interface import AppRecipe, TestRunResult
from environments.reproduction import CommandProcedure, ReproductionKind, parse_reproduction, stored_form
from environments.sandbox import Sandbox
from evidence.bundle import EvidenceBundle, RevisionEvidence
from evidence.interface import ArtifactKind, ArtifactRef, ArtifactStore, IntegrityError
from evidence.local import LocalArtifactStore
from evidence.report import render_report
from evidence.sandbox_view import DRAFTED_PROCEDURE_NAME
from evidence.serve import make_server
from tests.integration.evidence.test_report import cell, opened, section, watched
from tests.support.evidence_samples import BASE, CANDIDATE, RUN_ID, run_bundle
from tests.support.sandbox import sandbox
from tests.support.served import served

__all__ = ["sandbox"]

COMMAND = """
version: 1
kind: command
name: the average of an empty basket crashes
files:
  repro/average.py: |
    import sys
    sys.path.insert(0, ".")
    from basket import average
    print("computing </pre><script>alert('file')</script>")
    print(f"average: {average([])}")
steps:
  - run: python3 -c "print('ready')"
  - run: python3 repro/average.py
    timeout_s: 30
bug_present:
  - {check: stdout, matches: "(?m)^computing"}
  - {check: stderr, contains: "ZeroDivisionError"}
  - {check: exit_status, equals: "1"}
"""

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "repro/average.py", line 5, in <module>\n'
    "ZeroDivisionError: division by zero\n"
)


def step(command: str, exit_code: int | None, stdout: str = "", stderr: str = "", **more: bool) -> StepRecord:
    return StepRecord(command=command, exit_code=exit_code, stdout=stdout, stderr=stderr, **more)


def record(
    kind: ReproductionKind,
    status: ReproductionStatus,
    runs: list[CommandRunRecord],
    command: str = "",
) -> SandboxReproduction:
    detail = f"judged {status}"
    return SandboxReproduction(kind=kind, name="sample", status=status, detail=detail, runs=runs, command=command)


def held(index: int, description: str, holds: bool | None, actual: str | None) -> AssertionOutcome:
    return AssertionOutcome(index=index, description=description, holds=holds, actual=actual)


def put_record(store: ArtifactStore, label: str, revision: str, data: bytes) -> list[ArtifactRef]:
    """A revision's reproduction record and its run's sandbox log, named and typed as a worker stores them."""
    record_ref = store.put_bytes(
        data,
        kind=ArtifactKind.LOG,
        run_id=RUN_ID,
        name=f"{label}-reproduction.json",
        revision=revision,
        media_type="application/json",
    )
    sandbox_log = store.put_bytes(
        b"setup: ok\n", kind=ArtifactKind.LOG, run_id=RUN_ID, name=f"{label}-reproduction-run-1.log", revision=revision
    )
    return [sandbox_log, record_ref]


def sandbox_bundle(
    store: ArtifactStore,
    procedure: str,
    base: SandboxReproduction | bytes,
    candidate: SandboxReproduction | bytes,
    procedure_name: str = "procedure.json",
) -> EvidenceBundle:
    """The evidence of a command or test reproduction: its stored procedure (named as a reported one is, or
    ``procedure_name``), each revision's record."""
    procedure_ref = store.put_bytes(
        stored_form(parse_reproduction(procedure)),
        kind=ArtifactKind.PROCEDURE,
        run_id=RUN_ID,
        name=procedure_name,
        revision=BASE,
        media_type="application/json",
    )
    sides = []
    spec: list[tuple[Literal["base", "candidate"], str, str, SandboxReproduction | bytes]] = [
        ("base", BASE, "reproduce-base", base),
        ("candidate", CANDIDATE, "reproduce-candidate-1", candidate),
    ]
    for role, revision, label, found in spec:
        data = found if isinstance(found, bytes) else found.model_dump_json(indent=2).encode()
        status = found.status.value if isinstance(found, SandboxReproduction) else "inconclusive"
        detail = found.detail if isinstance(found, SandboxReproduction) else ""
        refs = put_record(store, label, revision, data)
        sides.append(RevisionEvidence.from_refs(role, revision, status, refs, detail=detail))
    patch = store.put_bytes(b"+    if not xs:\n+        return 0.0\n", kind=ArtifactKind.PATCH, run_id=RUN_ID)
    return run_bundle(procedure_ref, sides[0], sides[1], patch, repository="acme/basket", issue_number=24)


def output_cell(page: str, role: str, run: int, command: int) -> str:
    found = re.search(
        rf'<td class="output-cell" data-role="{role}" data-run="{run}" data-command="{command}">(.*?)</td>', page, re.S
    )
    assert found is not None, f"no output cell for {role} run {run} command {command}"
    return found.group(1)


def crashed_and_fixed() -> tuple[SandboxReproduction, SandboxReproduction]:
    """The basket's records as the runner writes them: the base crashes, the candidate prints an average."""
    first = "python3 -c \"print('ready')\""
    base = record(
        ReproductionKind.COMMAND,
        ReproductionStatus.REPRODUCED,
        [
            CommandRunRecord(
                run=1,
                steps=[
                    step(first, 0, "ready\n"),
                    step("python3 repro/average.py", 1, "computing </pre><script>alert('file')</script>\n", TRACEBACK),
                ],
                checks=[
                    held(0, "stdout matches '(?m)^computing'", True, "computing …"),
                    held(1, "stderr contains 'ZeroDivisionError'", True, TRACEBACK),
                    held(2, "exit_status equals '1'", True, "1"),
                ],
                bug_present=True,
            )
        ],
    )
    candidate = record(
        ReproductionKind.COMMAND,
        ReproductionStatus.NOT_REPRODUCED,
        [
            CommandRunRecord(
                run=1,
                steps=[
                    step(first, 0, "ready\n"),
                    step("python3 repro/average.py", 0, "computing\naverage: 0.0\n"),
                ],
                checks=[
                    held(0, "stdout matches '(?m)^computing'", True, "computing\naverage: 0.0\n"),
                    held(1, "stderr contains 'ZeroDivisionError'", False, ""),
                    held(2, "exit_status equals '1'", False, "0"),
                ],
            )
        ],
    )
    return base, candidate


def test_a_command_reproduction_shows_each_check_and_each_commands_output_on_both_revisions(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    base, candidate = crashed_and_fixed()
    bundle = sandbox_bundle(store, COMMAND, base, candidate)
    page = render_report(bundle, store, tmp_path / "report").read_text()

    assert '<th scope="row">reproduced with</th><td><span id="reproduction-kind">a command</span></td>' in page
    proof = section(page, "proof")
    assert "Reproduced with <strong>a command</strong>" in proof
    stderr_check = '<th scope="row">2. the stderr of the last command</th><td>contains <code>ZeroDivisionError</code>'
    assert stderr_check in proof
    assert '<th scope="row">3. the exit status of the last command</th><td>is <code>1</code></td>' in proof
    assert '<code class="observed">1</code> <span class="verdict pass">held</span>' in cell(page, "base", 3)
    not_held = '<code class="observed">0</code> <span class="verdict pass">did not hold</span>'
    assert not_held in cell(page, "candidate", 3)
    assert '<span class="verdict neutral">held</span>' in cell(page, "candidate", 1)
    assert '<a href="#output-run-1-command-2">the output</a>' in cell(page, "base", 2)

    # The last command's output on both revisions, with what each check read marked.
    shown = output_cell(page, "base", 1, 2)
    assert '<p class="exit"><mark data-check="3" title="read by check 3">exit status 1</mark></p>' in shown
    assert re.findall(r'<mark data-check="2"[^>]*>(.*?)</mark>', shown) == ["ZeroDivisionError: division by zero"]
    assert re.findall(r'<mark data-check="1"[^>]*>(.*?)</mark>', shown) == [
        "computing &lt;/pre&gt;&lt;script&gt;alert(&#x27;file&#x27;)&lt;/script&gt;"
    ]
    assert "  File &quot;repro/average.py&quot;, line 5, in &lt;module&gt;\n" in shown
    fixed = output_cell(page, "candidate", 1, 2)
    assert '<mark data-check="3" title="read by check 3">exit status 0</mark>' in fixed
    assert '<mark data-check="1" title="read by check 1">computing</mark>\naverage: 0.0</pre>' in fixed
    assert '<p class="note">no stderr</p>' in fixed
    # The first command is read by no check, so nothing of it is marked.
    assert "<mark" not in output_cell(page, "base", 1, 1) and "ready" in output_cell(page, "base", 1, 1)
    assert '<th scope="row">run 1 · command 2<br><code>python3 repro/average.py</code></th>' in page

    steps = section(page, "steps")
    assert "<p><code>repro/average.py</code></p>" in steps
    assert "&lt;/pre&gt;&lt;script&gt;alert(&#x27;file&#x27;)&lt;/script&gt;" in steps
    assert '<li><code>python3 repro/average.py</code> <span class="note">within 30 s</span></li>' in steps
    assert "<li>the stderr of the last command contains <code>ZeroDivisionError</code></li>" in steps
    assert "<script" not in page
    # The browser's sections have nothing to show here.
    assert 'id="blocked-requests"' not in page and "playwright show-trace" not in page


TEST = """
version: 1
kind: test
name: the average of an empty basket is 0
tests: [tests/test_basket.py]
timeout_s: 60
"""
PYTEST = "python3 -m pytest tests/test_basket.py"


def suite_run(exit_code: int, failing: list[str], passing: list[str], counts: str, out: str) -> CommandRunRecord:
    bug = exit_code != 0
    summary = f"exit {exit_code}; {counts}" if counts else f"exit {exit_code}"
    return CommandRunRecord(
        run=1,
        steps=[step(PYTEST, exit_code, out)],
        checks=[held(0, "the tests fail: tests/test_basket.py", bug, summary)],
        bug_present=bug,
        failing_tests=failing,
        passing_tests=passing,
        test_counts=counts,
    )


def test_a_test_reproduction_names_the_tests_failing_on_the_base_and_passing_on_the_candidate(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    cases = ["tests.test_basket::test_empty", "tests.test_basket::test_one"]
    base = record(
        ReproductionKind.TEST,
        ReproductionStatus.REPRODUCED,
        [suite_run(1, cases[:1], cases[1:], "1 failed, 1 passed", "F.\nFAILED test_empty - ZeroDivisionError\n")],
        command=PYTEST,
    )
    candidate = record(
        ReproductionKind.TEST,
        ReproductionStatus.NOT_REPRODUCED,
        [suite_run(0, [], cases, "2 passed", "..\n2 passed in 0.01s\n")],
        command=PYTEST,
    )
    page = render_report(sandbox_bundle(store, TEST, base, candidate), store, tmp_path / "report").read_text()

    assert '<span id="reproduction-kind">tests</span>' in page
    proof = section(page, "proof")
    assert "Reproduced with <strong>tests</strong>" in proof
    assert f'test command: <code id="test-command">{PYTEST}</code>' in proof
    assert "<li><code>tests/test_basket.py</code></li>" in proof
    assert (
        '<p id="fixed-tests">Failing on the base, passing on the candidate: '
        "<code>tests.test_basket::test_empty</code></p>"
    ) in proof
    rows = dict(re.findall(r'<tr class="test-case"><th scope="row"><code>(.*?)</code></th>(.*?)</tr>', proof))
    assert rows[cases[0]] == (
        '<td data-role="base"><span class="verdict pass">failed</span></td>'
        '<td data-role="candidate"><span class="verdict pass">passed</span></td>'
    )
    assert rows[cases[1]] == (
        '<td data-role="base"><span class="verdict fail">passed</span></td>'
        '<td data-role="candidate"><span class="verdict pass">passed</span></td>'
    )
    assert '<td data-role="base">exit status 1</td><td data-role="candidate">exit status 0</td>' in proof
    assert "<td>1 failed, 1 passed</td><td>2 passed</td>" in proof
    assert "FAILED test_empty - ZeroDivisionError" in output_cell(page, "base", 1, 1)
    # With a per-test report the judgement is per test, not the exit status: nothing is marked.
    assert "<mark" not in output_cell(page, "base", 1, 1)
    assert "2 passed in 0.01s" in output_cell(page, "candidate", 1, 1)
    assert f"run by the recipe's <code>test_subset</code>: <code>{PYTEST}</code>" in section(page, "steps")


def test_without_a_per_test_report_a_test_reproduction_is_shown_by_exit_status(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    failed, passed = suite_run(1, [], [], "", "F\n"), suite_run(0, [], [], "", ".\n")
    base = record(ReproductionKind.TEST, ReproductionStatus.REPRODUCED, [failed], PYTEST)
    candidate = record(ReproductionKind.TEST, ReproductionStatus.NOT_REPRODUCED, [passed], PYTEST)
    bundle = sandbox_bundle(store, TEST, base, candidate)
    proof = section(render_report(bundle, store, tmp_path / "report").read_text(), "proof")

    assert "No per-test report was read" in proof and 'class="test-case"' not in proof
    assert '<td data-role="base">exit status 1</td><td data-role="candidate">exit status 0</td>' in proof
    # The exit status is what the check read, so it is marked in the output.
    page = render_report(bundle, store, tmp_path / "report").read_text()
    assert '<p class="exit"><mark data-check="1" title="read by check 1">exit status 1</mark></p>' in output_cell(
        page, "base", 1, 1
    )


def test_a_reproduction_the_model_drafted_says_so_next_to_its_kind(tmp_path: Path) -> None:
    """The summary of a drafted reproduction (stored under the drafter's name) says the model drafted it from
    the report's prose; a reproduction from the report's own block says nothing of the kind."""
    store = LocalArtifactStore(tmp_path / "store")
    failed, passed = suite_run(1, [], [], "", "F\n"), suite_run(0, [], [], "", ".\n")
    base = record(ReproductionKind.TEST, ReproductionStatus.REPRODUCED, [failed], PYTEST)
    candidate = record(ReproductionKind.TEST, ReproductionStatus.NOT_REPRODUCED, [passed], PYTEST)

    drafted = sandbox_bundle(store, TEST, base, candidate, procedure_name=DRAFTED_PROCEDURE_NAME)
    summary = section(render_report(drafted, store, tmp_path / "drafted").read_text(), "summary")
    assert (
        '<span id="reproduction-kind">tests</span>, <span id="reproduction-drafted">drafted by the model from the '
        "report&#x27;s prose, and run on the base until it showed the bug</span>" in summary
    ), summary

    reported = sandbox_bundle(store, TEST, base, candidate)
    summary = section(render_report(reported, store, tmp_path / "reported").read_text(), "summary")
    assert '<span id="reproduction-kind">tests</span>' in summary and "drafted" not in summary


def test_hostile_huge_output_is_escaped_cut_and_linked_to_the_whole_record(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    hostile = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    lines = [hostile, "x" * 50_000, "bad bytes: \ufffd\ufffd"] + [f"line {n}" for n in range(4, 600)]
    lines[449] = "Traceback: the needle"
    stdout = "\n".join(lines) + "\n"
    procedure = COMMAND.replace('matches: "(?m)^computing"', "contains: needle")
    base, candidate = crashed_and_fixed()
    base.runs[0].steps[1] = step("python3 repro/average.py", 1, stdout, TRACEBACK, stdout_cut=True)
    bundle = sandbox_bundle(store, procedure, base, candidate)
    page = render_report(bundle, store, tmp_path / "report").read_text(encoding="utf-8")

    assert "<script" not in page and "<img src=x" not in page
    shown = output_cell(page, "base", 1, 2)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;\n" in shown
    assert "bad bytes: \ufffd\ufffd" in shown
    # The long line is cut and says by how much; only the first lines are shown.
    assert "x" * 2_000 + '<span class="cut"> … 48000 more characters</span>' in shown
    assert "line 5\n" in shown and "line 599" not in shown
    record_ref = next(r for r in bundle.base.logs if r.name == "reproduce-base-reproduction.json")
    note = re.search(r'<pre class="output" data-stream="stdout">.*?</pre><p class="note">(.*?)</p>', shown, re.S)
    assert note is not None
    assert "the first 200 of 599 lines are shown; 1 long line is cut" in note.group(1)
    assert "the command wrote more than the record keeps" in note.group(1)
    # The needle is on line 450, beyond what is shown: the note says where the check read it.
    assert "check 1 read line 450, beyond those shown" in note.group(1)
    assert f'the whole stdout kept is in <a href="{store.url_for(record_ref)}">{record_ref.name}</a>' in note.group(1)
    assert len(page) < 200_000


def test_a_record_that_does_not_read_is_said_so_and_the_rest_of_the_page_renders(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    shaped_wrong = b'{"kind": "command", "runs": [{"run": "one", "steps": []}]}'
    bundle = sandbox_bundle(store, COMMAND, b"\x89PNG not json", shaped_wrong)
    page = render_report(bundle, store, tmp_path / "report").read_text()

    assert "could not be shown: reproduce-base-reproduction.json is not JSON" in cell(page, "base", 1)
    assert (
        "could not be shown: reproduce-candidate-1-reproduction.json is not a record of a command or test "
        "reproduction (runs.0.run: Input should be a valid integer)"
    ) in cell(page, "candidate", 2)
    assert "no run was recorded on either revision" in section(page, "reproduction")
    assert "could not be shown" in page[page.index('id="side-base"') : page.index('id="side-candidate"')]
    assert '<span class="add">+    if not xs:</span>' in section(page, "patch")
    # The procedure is still shown in full.
    assert "<li>the exit status of the last command is <code>1</code></li>" in section(page, "steps")


def test_a_tampered_record_fails_the_render_rather_than_show_it(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    base, candidate = crashed_and_fixed()
    bundle = sandbox_bundle(store, COMMAND, base, candidate)
    stored = store.object_path(next(r for r in bundle.candidate.logs if r.name.endswith("reproduction.json")).key)
    stored.chmod(0o644)
    stored.write_bytes(stored.read_bytes().replace(b'"exit_code": 0', b'"exit_code": 1'))
    with pytest.raises(IntegrityError):
        render_report(bundle, store, tmp_path / "report")


BUGGY = "def average(xs):\n    return sum(xs) / len(xs)\n"
FIXED = "def average(xs):\n    return sum(xs) / len(xs) if xs else 0.0\n"


def reproduce(ws: Path, source: str, procedure: CommandProcedure, sandbox: Sandbox) -> SandboxReproduction:
    """The procedure run for real in the sandbox on a workspace whose ``basket.py`` is ``source``."""
    ws.mkdir(parents=True)
    (ws / "basket.py").write_text(source)
    recipe = AppRecipe(start="true", test="true")

    def sandboxed(command: str, log: Path, setup: bool, timeout_s: float) -> TestRunResult:
        return run_tests(ws, recipe, timeout_s, log_path=log, command=command, sandbox=sandbox)

    return reproduce_in_sandbox(ws, recipe, procedure, sandboxed, ws.parent / f"{ws.name}-logs")


@pytest.mark.browser
@pytest.mark.slow
def test_a_command_reproduction_run_in_the_sandbox_renders_in_chromium(
    tmp_path: Path, sandbox: Sandbox, chromium: Browser
) -> None:
    procedure = parse_reproduction(COMMAND)
    assert isinstance(procedure, CommandProcedure)
    base = reproduce(tmp_path / "base", BUGGY, procedure, sandbox)
    candidate = reproduce(tmp_path / "candidate", FIXED, procedure, sandbox)
    assert base.status == ReproductionStatus.REPRODUCED, base.detail
    assert candidate.status == ReproductionStatus.NOT_REPRODUCED, candidate.detail

    with served(make_server(tmp_path / "store")) as server:
        store = LocalArtifactStore(tmp_path / "store", public_url=server.url)
        bundle = sandbox_bundle(store, COMMAND, base, candidate)
        rendered = render_report(bundle, store, tmp_path / "report")
        report = store.put_file(rendered, kind=ArtifactKind.REPORT, run_id=RUN_ID, name="evidence.html")
        page = chromium.new_page()
        problems = watched(page)
        page.on("dialog", lambda dialog: problems.append(f"dialog: {dialog.message}"))
        opened(page, store.url_for(report))

        assert page.inner_text("#reproduction-kind") == "a command"
        assert page.inner_text("#verdict") == "all checks passed"
        assert page.inner_text('#proof td[data-role="base"][data-check="2"] .verdict') == "held"
        assert page.inner_text('#proof td[data-role="candidate"][data-check="3"] .verdict') == "did not hold"
        base_cell = '#reproduction td[data-role="base"][data-run="1"][data-command="2"]'
        assert page.inner_text(f"{base_cell} mark[data-check='2']") == "ZeroDivisionError: division by zero"
        assert page.inner_text(f"{base_cell} .exit mark") == "exit status 1"
        candidate_cell = '#reproduction td[data-role="candidate"][data-run="1"][data-command="2"]'
        assert "average: 0.0" in page.inner_text(f"{candidate_cell} pre[data-stream='stdout']")
        # The hostile line the script printed is text on the page, and nothing of it runs.
        assert "<script>alert('file')</script>" in page.inner_text(f"{base_cell} pre[data-stream='stdout']")
        assert page.locator("script").count() == 0
        # Marked lines are drawn marked: the browser's default highlight, not plain text.
        background = page.eval_on_selector(f"{base_cell} mark", "m => getComputedStyle(m).backgroundColor")
        assert background not in ("rgba(0, 0, 0, 0)", "transparent")
        # A check's "the output" link leads to the row of the command it read.
        page.click('#proof td[data-role="base"][data-check="2"] a')
        assert page.evaluate("location.hash") == "#output-run-1-command-2"
        assert problems == []
        page.close()


@pytest.mark.browser
def test_a_long_command_wraps_inside_its_column_in_chromium(tmp_path: Path, chromium: Browser) -> None:
    """A command with no space to break at (a ``python -c`` one-liner, a long path) stays inside the first
    column of *What each command wrote* instead of running over the outputs next to it."""
    first = "python3 -c \"print('ready')\""
    long = "python3 -c \"print('" + "ready" * 30 + "')\""
    procedure = COMMAND.replace(first, long)
    base, candidate = crashed_and_fixed()
    for found in (base, candidate):
        found.runs[0].steps[0].command = long
    with served(make_server(tmp_path / "store")) as server:
        store = LocalArtifactStore(tmp_path / "store", public_url=server.url)
        rendered = render_report(sandbox_bundle(store, procedure, base, candidate), store, tmp_path / "report")
        report = store.put_file(rendered, kind=ArtifactKind.REPORT, run_id=RUN_ID, name="evidence.html")
        page = chromium.new_page(viewport={"width": 1200, "height": 900})
        opened(page, store.url_for(report))
        header = page.locator("#output-run-1-command-1 th")
        # Wrapped, not cut: every character is there, the lines broken only where the column ends.
        assert "".join(header.locator("code").inner_text().split("\n")) == long
        widths = header.evaluate("th => [th.scrollWidth, th.clientWidth]")
        assert widths[0] <= widths[1], widths
        page.close()
