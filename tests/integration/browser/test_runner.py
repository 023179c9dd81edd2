from __future__ import annotations

import json
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from browser.procedure import Procedure, parse_procedure
from browser.results import ReproductionStatus
from browser.runner import BrowserRunner
from browser.session import VIEWPORT
from environments.ports import free_port
from tests.support.browser_apps import CART_DIR, PagesServer, base_url_of, serve_static
from tests.support.pixels import colourful_pixels, png_size

pytestmark = pytest.mark.browser

CART = parse_procedure((CART_DIR / "repro.yaml").read_text())


def procedure(steps: str, bug_present: str, runs: int = 1) -> Procedure:
    return parse_procedure(f"version: 1\nname: test\nruns: {runs}\nsteps:\n{steps}\nbug_present:\n{bug_present}\n")


def test_cart_procedure_reproduces_on_the_buggy_app(runner: BrowserRunner, cart_url: str, out_dir: Path) -> None:
    announced: list[tuple[int, str]] = []
    result = runner.run(CART, cart_url, out_dir, on_step=lambda i, d: announced.append((i, d)))

    assert result.status == ReproductionStatus.REPRODUCED, result.detail
    assert [r.bug_present for r in result.runs] == [True] * CART.runs
    assert result.runs[0].assertions[0].actual == "$23.75"
    assert "$23.75" in result.detail
    assert [i for i, _ in announced] == list(range(len(CART.steps))) * CART.runs
    assert all(p.is_file() and p.stat().st_size > 0 for p in [*result.trace_paths, *result.screenshot_paths])
    assert len(result.trace_paths) == CART.runs
    assert all(a.screenshot in result.screenshot_paths for r in result.runs for a in r.assertions)


def test_each_assertion_on_an_element_crops_that_element_and_the_log_names_the_files(
    runner: BrowserRunner, cart_url: str, out_dir: Path
) -> None:
    result = runner.run(CART, cart_url, out_dir)

    crops = [a.element_screenshot for r in result.runs for a in r.assertions]
    assert [c.name if c else None for c in crops] == [f"run-{n}-assert-1-element.png" for n in (1, 2)]
    for crop in crops:
        assert crop is not None and crop in result.screenshot_paths
        width, height = png_size(crop.read_bytes())
        # The element (the total's cell), not the viewport.
        assert 0 < width < VIEWPORT["width"] and 0 < height < VIEWPORT["height"] // 4
    log = json.loads(result.log_path.read_text())
    (logged,) = log["runs"][0]["outcome"]["assertions"]
    assert logged["actual"] == "$23.75" and logged["holds"] is True
    assert (logged["screenshot"], logged["element_screenshot"]) == ("run-1-assert-1.png", "run-1-assert-1-element.png")


def test_no_crop_for_a_hidden_element_or_a_check_on_no_element(runner: BrowserRunner, out_dir: Path) -> None:
    page = '<p id="shown">shown</p><p id="hidden" hidden>hidden</p>'
    checks = procedure(
        "  - {action: goto}",
        "  - {action: expect_visible, selector: '#hidden'}\n"
        "  - {action: expect_url, matches: '^/$'}\n"
        "  - {action: expect_text, selector: '#shown', equals: shown}",
    )
    with serve_static({"/": page}) as url:
        result = runner.run(checks, url, out_dir)

    hidden, url_check, shown = result.runs[0].assertions
    assert (hidden.holds, hidden.actual, hidden.element_screenshot) == (False, "not visible", None)
    assert url_check.holds is True and url_check.element_screenshot is None
    assert shown.element_screenshot is not None and shown.element_screenshot.is_file()
    events = json.loads(result.log_path.read_text())["runs"][0]["events"]
    skipped = [(e["name"], e["reason"]) for e in events if e["kind"] == "screenshot_skipped"]
    assert skipped == [("run-1-assert-1-element.png", "the element is not visible")]


def test_an_emoji_on_the_page_is_drawn_in_colour_in_the_crop(runner: BrowserRunner, out_dir: Path) -> None:
    # A missing emoji font draws a grey box; a colour emoji font draws coloured pixels.
    page = '<p id="name" style="font:32px sans-serif">t\N{INFORMATION DESK PERSON}t*</p>'
    checks = procedure("  - {action: goto}", "  - {action: expect_text, selector: '#name', contains: '*'}")
    with serve_static({"/": page}) as url:
        result = runner.run(checks, url, out_dir)

    (assertion,) = result.runs[0].assertions
    assert assertion.actual == "t\N{INFORMATION DESK PERSON}t*" and assertion.holds is True
    assert assertion.element_screenshot is not None
    assert colourful_pixels(assertion.element_screenshot.read_bytes()) > 50


def test_cart_procedure_does_not_reproduce_on_a_fixed_copy(
    runner: BrowserRunner, fixed_cart_url: str, out_dir: Path
) -> None:
    result = runner.run(CART, fixed_cart_url, out_dir)

    assert result.status == ReproductionStatus.NOT_REPRODUCED, result.detail
    assert [r.bug_present for r in result.runs] == [False] * CART.runs
    assert result.runs[0].assertions[0].actual == "$40.00"


def test_stored_trace_is_a_playwright_trace_of_the_procedures_actions(
    runner: BrowserRunner, cart_url: str, out_dir: Path
) -> None:
    result = runner.run(CART, cart_url, out_dir)

    with zipfile.ZipFile(result.trace_paths[0]) as trace:
        names = trace.namelist()
        events = [json.loads(line) for line in trace.read("trace.trace").decode().splitlines() if line]
    assert "trace.network" in names
    assert any(name.startswith("screencast/") for name in names)
    assert events[0]["type"] == "context-options"
    calls = [e for e in events if e["type"] == "before"]
    methods = {e["method"] for e in calls}
    # An assertion's text is read by a length-capped evaluation in the page (browser/checks.py), which the
    # trace shows as the wait for its element; every request passed the origin guard ("continue").
    assert {"goto", "waitForSelector", "screenshot", "continue"} <= methods
    goto = next(e for e in calls if e["method"] == "goto")
    assert goto["params"]["url"] == f"{cart_url}/"
    assert any(e["type"] == "frame-snapshot" for e in events)


def test_runs_that_disagree_are_inconclusive(runner: BrowserRunner, pages: PagesServer, out_dir: Path) -> None:
    flaky = procedure(
        "  - {action: goto, path: /flaky}",
        "  - {action: expect_text, selector: '#verdict', equals: bad}",
        runs=3,
    )
    result = runner.run(flaky, base_url_of(pages), out_dir)

    assert result.status == ReproductionStatus.INCONCLUSIVE
    assert {r.bug_present for r in result.runs} == {True, False}
    assert all(r.complete for r in result.runs)
    assert "runs disagree" in result.detail


def test_a_selector_that_never_appears_is_a_finding_not_a_crash(
    runner: BrowserRunner, cart_url: str, out_dir: Path
) -> None:
    missing = procedure(
        "  - {action: goto}\n  - {action: click, selector: '#apply-coupon', timeout_ms: 500}",
        "  - {action: expect_text, selector: '#total', not_equals: $40.00}",
    )
    result = runner.run(missing, cart_url, out_dir)

    assert result.status == ReproductionStatus.INCONCLUSIVE
    assert result.runs[0].failed_step == 1
    assert result.runs[0].assertions == []
    assert "#apply-coupon" in result.detail and "500ms exceeded" in result.detail
    assert any(p.name == "run-1-step-2-failed.png" for p in result.screenshot_paths)


def test_an_assertion_on_an_ambiguous_selector_is_not_evaluated(
    runner: BrowserRunner, cart_url: str, out_dir: Path
) -> None:
    ambiguous = procedure("  - {action: goto}", "  - {action: expect_text, selector: tr.line, contains: tea}")
    result = runner.run(ambiguous, cart_url, out_dir)

    assert result.status == ReproductionStatus.INCONCLUSIVE
    (assertion,) = result.runs[0].assertions
    assert assertion.holds is None
    assert assertion.error is not None and "strict mode violation" in assertion.error


def test_an_app_that_refuses_connections_is_inconclusive(runner: BrowserRunner, out_dir: Path) -> None:
    result = runner.run(CART, f"http://127.0.0.1:{free_port()}", out_dir)

    assert result.status == ReproductionStatus.INCONCLUSIVE
    assert result.runs[0].failed_step == 0
    assert "ERR_CONNECTION_REFUSED" in result.detail


def test_log_collects_console_page_errors_failed_requests_and_error_responses(
    runner: BrowserRunner, pages: PagesServer, out_dir: Path
) -> None:
    noisy = procedure(
        "  - {action: goto, path: /noisy}\n"
        "  - {action: wait_for, selector: '#done'}\n"
        "  - {action: expect_response_status, path: /missing-resource, status: 404}",
        "  - {action: expect_visible, selector: '#done'}",
    )
    result = runner.run(noisy, base_url_of(pages), out_dir)

    assert result.status == ReproductionStatus.REPRODUCED, result.detail
    log = json.loads(result.log_path.read_text())
    assert log["status"] == "reproduced"
    events = log["runs"][0]["events"]
    kinds = {e["kind"] for e in events}
    assert {"console", "pageerror", "requestfailed", "response", "step", "assertion"} <= kinds
    assert any(e["kind"] == "console" and e["level"] == "error" and "boom" in e["text"] for e in events)
    assert any(e["kind"] == "pageerror" and "kaboom" in e["message"] for e in events)
    assert any(e["kind"] == "requestfailed" and e["url"].endswith("/refused") for e in events)
    assert any(e["kind"] == "response" and e["status"] == 404 and "/missing-resource" in e["url"] for e in events)


def test_on_step_raising_cancels_the_run_before_the_next_step(
    runner: BrowserRunner, cart_url: str, out_dir: Path
) -> None:
    class Cancelled(Exception):
        """Raised from on_step, as a heartbeat does when the activity was cancelled."""

    announced: list[int] = []

    def on_step(index: int, _description: str) -> None:
        announced.append(index)
        if index == 1:
            raise Cancelled

    with pytest.raises(Cancelled):
        runner.run(CART, cart_url, out_dir, on_step=on_step)

    assert announced == [0, 1]
    assert json.loads((out_dir / "log.json").read_text())["status"] == "cancelled"
    assert runner.run(CART, cart_url, out_dir).status == ReproductionStatus.REPRODUCED


def test_threads_share_the_kept_browser_concurrently(
    runner: BrowserRunner, cart_url: str, fixed_cart_url: str, tmp_path: Path
) -> None:
    launches = runner.launches
    threads: set[str] = set()

    def reproduce(url: str, name: str) -> ReproductionStatus:
        return runner.run(
            CART, url, tmp_path / name, on_step=lambda *_: threads.add(threading.current_thread().name)
        ).status

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="activity") as pool:
        buggy = pool.submit(reproduce, cart_url, "buggy")
        fixed = pool.submit(reproduce, fixed_cart_url, "fixed")
        statuses = (buggy.result(timeout=120), fixed.result(timeout=120))

    assert statuses == (ReproductionStatus.REPRODUCED, ReproductionStatus.NOT_REPRODUCED)
    # on_step ran on the callers' threads (where a Temporal heartbeat must happen), not the browser's.
    assert threads == {"activity_0", "activity_1"}
    assert runner.launches == launches
