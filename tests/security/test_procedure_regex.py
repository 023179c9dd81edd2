"""Hostile regular expressions in a report's procedure: refused when RE2 cannot evaluate them, answered fast
when they are catastrophic for a backtracking engine, and never stalling the worker's other activities.

``(x+x+)+y`` is the issue's probe: Python's ``re`` took 4.2 s on 26 characters (and doubles with each one
more), holding the GIL. Here it meets 20,000 characters of page text and a URL path of 1,900, in real
Chromium, and then runs in ``browser.reproduce`` on a real worker next to an activity that heartbeats; the
heartbeats are read from the Temporal server's description of the workflow.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from browser import patterns
from browser import procedure as procedure_module
from browser.patterns import MAX_TEXT_CHARS, compile_pattern, search
from browser.procedure import Procedure, ProcedureError, extract_procedure, parse_procedure
from browser.results import ReproductionStatus
from browser.runner import BrowserRunner
from environments.interface import EnvironmentHandle
from evidence.interface import ArtifactKind
from evidence.local import LocalArtifactStore
from pipeline import steps
from pipeline.activities.browser import BrowserActivities
from pipeline.steps import ReproduceInput, ReproduceResult
from tests.support.browser_apps import serve_static

CATASTROPHIC = "(x+x+)+y"
LONG_PATH = "/" + "x" * 1_900  # a goto path is at most 2,000 characters


def procedure_with(pattern: str, runs: int = 1) -> Procedure:
    return parse_procedure(
        f"version: 1\nname: catastrophic\nruns: {runs}\nsteps:\n"
        f"  - {{action: goto, path: '{LONG_PATH}'}}\n"
        "  - {action: wait_for, selector: '#log'}\n"
        "bug_present:\n"
        f"  - {{action: expect_text, selector: '#log', matches: '{pattern}'}}\n"
        f"  - {{action: expect_url, matches: '{pattern}'}}\n"
    )


# Python's re needs time exponential in this; RE2 linear. (The cap itself is tested with more.)
LONG_TEXT_CHARS = 20_000


def long_text_pages(chars: int = LONG_TEXT_CHARS) -> dict[str, str]:
    # Wrapped, so the crop of the element the check read stays a screenful, not 100,000 characters wide.
    page = f"<!doctype html><div id='log' style='font:4px monospace;word-break:break-all'>{'x' * chars}</div>"
    return {"/": page, LONG_PATH: page}


# ---- refused when the procedure is parsed -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "named"),
    [
        (r"(a)\1", r"a backreference (\1)"),
        ("(?P<n>a)(?P=n)", "named backreferences or recursion (?P=name)"),
        ("total(?= USD)", "lookahead (?=...)"),
        ("total(?! USD)", "negative lookahead (?!...)"),
        ("(?<=\\$)40", "lookbehind (?<=...)"),
        ("(?<!\\$)40", "negative lookbehind (?<!...)"),
        ("(?>x+)y", "atomic groups (?>...)"),
        ("x++y", "possessive quantifiers (++)"),
    ],
)
def test_a_pattern_re2_cannot_evaluate_is_refused_naming_the_syntax(pattern: str, named: str) -> None:
    shapes = (
        f"{{action: expect_url, matches: '{pattern}'}}",
        f"{{action: expect_text, selector: p, matches: '{pattern}'}}",
    )
    for shape in shapes:
        text = f"version: 1\nname: n\nsteps:\n  - {{action: goto}}\nbug_present:\n  - {shape}\n"
        with pytest.raises(ProcedureError) as refused:
            parse_procedure(text, first_line=10)
        assert refused.value.line == 15
        assert f"uses {named}, which is not supported (RE2 syntax, linear time)" in refused.value.message


def test_patterns_and_reports_are_length_capped() -> None:
    with pytest.raises(ProcedureError, match="at most 500 characters"):
        parse_procedure(
            "version: 1\nname: n\nsteps:\n  - {action: goto}\n"
            f"bug_present:\n  - {{action: expect_url, matches: '{'x' * 501}'}}\n"
        )
    with pytest.raises(ProcedureError, match="the report is longer than"):
        extract_procedure("x" * 300_000)


# ---- answered fast ------------------------------------------------------------------------------------------


def test_the_catastrophic_pattern_is_searched_in_bounded_work_over_at_most_the_cap() -> None:
    """Bounded by work, not by a clock: RE2 visits each character it searches once per program instruction.

    A backtracking engine (Python's ``re``) never finishes this pattern on 20,000 x's; RE2's work is at most
    its program's size times the characters searched, and a check searches no more than the cap.
    """
    compiled = compile_pattern(CATASTROPHIC)
    assert type(compiled).__module__ == "re2", type(compiled)
    assert compiled.programsize <= 16, compiled.programsize
    searched: list[int] = []

    class Counting:
        def search(self, text: str) -> object:
            searched.append(len(text))
            return compiled.search(text)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(patterns, "compile_pattern", lambda _pattern: Counting())
        assert not search(CATASTROPHIC, "x" * MAX_TEXT_CHARS)
        assert search(CATASTROPHIC, "x" * MAX_TEXT_CHARS + "y") is False  # beyond the cap is never read
        assert search(CATASTROPHIC, "x" * 1_000 + "y")
    assert searched == [MAX_TEXT_CHARS, MAX_TEXT_CHARS, 1_001]


def test_finding_the_block_in_a_hostile_report_looks_at_each_line_a_bounded_number_of_times() -> None:
    """A fence line of 60,000 spaces and a stray backtick took Python's regex about half a minute.

    Bounded by work: every line is looked at once as a possible opening fence or once as a possible closing
    one, and each look is one pass over the line (no pattern that can backtrack).
    """
    looks: list[str] = []
    opens, closes = procedure_module._fence_open, procedure_module._fence_closes
    body = "```" + " " * 60_000 + "`\n" + "~~~" + "~" * 60_000 + "`\n" + "text\n" * 1_000

    def counted_open(line: str) -> tuple[str, str] | None:
        looks.append("open")
        return opens(line)

    def counted_closes(line: str, fence: str) -> bool:
        looks.append("close")
        return closes(line, fence)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(procedure_module, "_fence_open", counted_open)
        mp.setattr(procedure_module, "_fence_closes", counted_closes)
        assert extract_procedure(body) is None
    assert len(looks) <= len(body.splitlines()), len(looks)


@pytest.mark.browser
def test_a_catastrophic_pattern_on_a_long_page_is_answered_about_as_fast_as_a_trivial_one(
    runner: BrowserRunner,
    tmp_path: Path,
) -> None:
    with serve_static(long_text_pages()) as app:
        runner.run(procedure_with("x+y"), app, tmp_path / "warm")
        trivial = runner.run(procedure_with("x+y"), app, tmp_path / "trivial")
        catastrophic = runner.run(procedure_with(CATASTROPHIC), app, tmp_path / "catastrophic")

    # Evaluated (held: False), not timed out, on every check: a backtracking engine (Python's re) takes about a
    # second for this pattern on 24 x's, four times longer with every two more, and would time the check out on
    # 20,000. The work each check does is bounded by the test above (RE2, the cap).
    for result in (trivial, catastrophic):
        assert result.status == ReproductionStatus.NOT_REPRODUCED, result.detail
        assert [a.holds for a in result.runs[0].assertions] == [False, False]
    assert catastrophic.runs[0].assertions[0].actual == "x" * LONG_TEXT_CHARS
    assert catastrophic.runs[0].assertions[1].actual == LONG_PATH


@pytest.mark.browser
def test_text_longer_than_the_cap_is_cut_in_the_page_and_says_so(
    runner: BrowserRunner,
    tmp_path: Path,
) -> None:
    with serve_static(long_text_pages(MAX_TEXT_CHARS + 5_000)) as app:
        result = runner.run(procedure_with("x+y"), app, tmp_path / "cut")
    actual = result.runs[0].assertions[0].actual
    assert actual == "x" * MAX_TEXT_CHARS + f" [cut at {MAX_TEXT_CHARS} of {MAX_TEXT_CHARS + 5_000} characters]"


# ---- the worker's other activities keep heartbeating ------------------------------------------------------

HEARTBEAT_EVERY_S = 0.1


@activity.defn(name="security.heartbeat_steadily")
def heartbeat_steadily(seconds: float) -> int:
    """Heartbeats every 0.1 s for ``seconds``: a long activity sharing the worker with the reproduction."""
    beats = 0
    until = time.monotonic() + seconds
    while time.monotonic() < until and not activity.is_cancelled():
        activity.heartbeat(beats)
        beats += 1
        time.sleep(HEARTBEAT_EVERY_S)
    return beats


@workflow.defn(name="security_regex_neighbours")
class Neighbours:
    @workflow.run
    async def run(self, inp: ReproduceInput) -> ReproduceResult:
        beating = workflow.start_activity(
            heartbeat_steadily,
            15.0,
            start_to_close_timeout=timedelta(seconds=120),
            heartbeat_timeout=timedelta(seconds=5),
        )
        result: ReproduceResult = await workflow.execute_activity(
            steps.REPRODUCE.name,
            inp,
            result_type=ReproduceResult,
            start_to_close_timeout=timedelta(seconds=120),
            heartbeat_timeout=timedelta(seconds=30),
        )
        beating.cancel()
        return result


@pytest.fixture
def app() -> Iterator[str]:
    with serve_static(long_text_pages()) as url:
        yield url


@pytest.mark.browser
@pytest.mark.slow
async def test_another_activitys_heartbeats_keep_reaching_the_server_while_the_check_runs(
    temporal_client: Client,
    runner: BrowserRunner,
    app: str,
    tmp_path: Path,
) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    run_id = f"repair:acme/regex#{uuid.uuid4().hex[:8]}"
    # Two runs of two catastrophic checks on 20,000 characters and a URL of 1,900: the reproduction lasts
    # seconds (mostly screenshots), the checks themselves milliseconds.
    procedure = procedure_with(CATASTROPHIC, runs=2)
    ref = store.put_bytes(procedure.model_dump_json().encode(), kind=ArtifactKind.PROCEDURE, run_id=run_id)
    inp = ReproduceInput(
        run_id=run_id,
        op_id=f"{run_id}:reproduce-base:1",
        revision="a" * 40,
        procedure_ref=ref,
        environment=EnvironmentHandle(env_id="env", provider="local", run_id=run_id, op_id="env", base_url=app),
    )
    queue = f"security-regex-{uuid.uuid4().hex}"
    activities = BrowserActivities(store, lambda: runner)
    # Heartbeats go to the server at most every 0.2 s (the default would be every 4 s at a 5 s timeout).
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as executor:
        async with Worker(
            temporal_client,
            task_queue=queue,
            workflows=[Neighbours],
            activities=[heartbeat_steadily, activities.reproduce],
            activity_executor=executor,
            workflow_runner=UnsandboxedWorkflowRunner(),
            max_heartbeat_throttle_interval=timedelta(milliseconds=200),
            default_heartbeat_throttle_interval=timedelta(milliseconds=200),
        ):
            handle = await temporal_client.start_workflow(Neighbours.run, inp, id=queue, task_queue=queue)
            ages: list[float] = []
            seen: set[datetime] = set()
            task = asyncio.ensure_future(handle.result())
            while not task.done():
                described = await handle.describe()
                pending = {p.activity_type.name: p for p in described.raw_description.pending_activities}
                beater, reproducing = pending.get("security.heartbeat_steadily"), pending.get(steps.REPRODUCE.name)
                if beater is not None and reproducing is not None and beater.HasField("last_heartbeat_time"):
                    stamp = beater.last_heartbeat_time.ToDatetime(tzinfo=UTC)
                    ages.append((datetime.now(UTC) - stamp).total_seconds())
                    seen.add(stamp)
                await asyncio.sleep(0.2)
            result = await task

    assert result.status == ReproductionStatus.NOT_REPRODUCED, result.detail
    assert result.runs == 2
    # Sampled while both ran: the server kept receiving fresh heartbeats, never one older than a second.
    assert len(ages) >= 5 and len(seen) >= 5, (ages, seen)
    assert max(ages) < 1.0, ages
    print(f"{len(ages)} samples while both ran; heartbeat age on the server at most {max(ages):.2f} s")
