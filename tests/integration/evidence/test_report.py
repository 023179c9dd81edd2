"""The reviewer's report: content, escaping, integrity, and how it renders in real Chromium."""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page
from temporalio.testing import ActivityEnvironment

from browser.results import ReproductionStatus
from browser.runner import BrowserRunner
from environments.interface import EnvironmentHandle
from evidence.bundle import RevisionEvidence, bundle_digest
from evidence.interface import ArtifactKind, IntegrityError
from evidence.local import LocalArtifactStore
from evidence.report import render_report
from evidence.serve import make_server
from pipeline.activities.browser import BrowserActivities
from pipeline.ids import op_id
from pipeline.steps import PrepareProcedureInput, ReproduceInput
from tests.support.browser_apps import serve_static
from tests.support.chromium import chromium_path
from tests.support.evidence_samples import BASE, CANDIDATE, RUN_ID, run_bundle, solid_png, store_cart_bundle
from tests.support.pixels import colourful_pixels
from tests.support.served import served


def cell(page: str, role: str, check: int = 1) -> str:
    """The proof table's cell for ``role`` and check number ``check`` (1-based)."""
    found = re.search(rf'<td class="observed-cell" data-role="{role}" data-check="{check}">(.*?)</td>', page, re.S)
    assert found is not None, f"no proof cell for {role} check {check}"
    return found.group(1)


def section(page: str, name: str) -> str:
    found = re.search(rf'<section id="{name}">(.*?)</section>', page, re.S)
    assert found is not None, f"no section {name}"
    return found.group(1)


def watched(page: Page) -> list[str]:
    """The console errors and uncaught exceptions of ``page``, as they come."""
    problems: list[str] = []
    page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda err: problems.append(str(err)))
    return problems


def opened(page: Page, url: str) -> None:
    """``page`` at ``url``, loaded, which answered 200."""
    response = page.goto(url, wait_until="load")
    assert response is not None and response.status == 200


def test_report_shows_both_revisions_steps_patch_checks_and_hashes(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    bundle = store_cart_bundle(store, solid_png(8, 4, (200, 0, 0)), solid_png(8, 4, (0, 160, 0)))
    page = render_report(bundle, store, tmp_path / "report").read_text()

    assert BASE[:12] in page and CANDIDATE[:12] in page
    assert "reproduced: every check held, the bug is present" in page
    assert "not reproduced: some check did not hold, the bug is absent" in page
    # Per revision: the page after the check, and the crop of the element it read; run 2's identical
    # pixels are not embedded again.
    assert len(re.findall(r'<img src="data:image/png;base64,', page)) == 4
    assert '<span class="add">+    return sum(line_total(item) for item in items)' in page
    assert "4 passed in 0.03s" in page
    assert "playwright show-trace FILE" in page
    assert bundle_digest(bundle) in page
    for ref in bundle.artifacts():
        assert ref.sha256 in page


def test_each_check_shows_what_it_expects_and_what_each_revision_showed(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    bundle = store_cart_bundle(store, solid_png(8, 4, (200, 0, 0)), solid_png(8, 4, (0, 160, 0)))
    page = render_report(bundle, store, tmp_path / "report").read_text()

    proof = section(page, "proof")
    assert '<th scope="row">1. the text of <code>#total</code></th><td>is not <code>$40.00</code></td>' in proof
    base, candidate = cell(page, "base"), cell(page, "candidate")
    assert '<code class="observed">$23.75</code> <span class="verdict pass">holds</span>' in base
    assert '<code class="observed">$40.00</code> <span class="verdict pass">does not hold</span>' in candidate
    # Both runs saw the same, so they are one entry.
    assert "runs 1, 2" in base and "runs 1, 2" in candidate
    for role, side in (("base", bundle.base), ("candidate", bundle.candidate)):
        crop = next(r for r in side.screenshots if r.name.endswith("run-1-assert-1-element.png"))
        whole = next(r for r in side.screenshots if r.name.endswith("run-1-assert-1.png"))
        shown = cell(page, role)
        assert f'id="shot-{role}-{crop.sha256[:16]}"' in shown
        assert base64.b64encode(store.read_bytes(crop)).decode() in shown
        assert (
            f'alt="{role} revision, run 1, check 1: the element it read"'.replace(
                "candidate revision", "candidate commit"
            )
            in shown
        )
        # The whole page is linked to its figure in the screenshots section, which opens full size.
        assert f'<a class="page" href="#shot-{role}-{whole.sha256[:16]}">the whole page</a>' in shown
        assert f'<figure class="zoom" id="shot-{role}-{whole.sha256[:16]}">' in section(page, "reproduction")


def test_a_hostile_observed_value_is_shown_escaped(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    hostile = '<script>alert(1)</script><img src=x onerror="alert(2)">'
    bundle = store_cart_bundle(
        store, solid_png(2, 2, (0, 0, 0)), solid_png(2, 2, (9, 9, 9)), base_actual=hostile, candidate_actual="\ud800"
    )
    page = render_report(bundle, store, tmp_path / "report").read_text(encoding="utf-8")

    assert "<script" not in page and "<img src=x" not in page
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=&quot;alert(2)&quot;&gt;"
    assert f'<code class="observed">{escaped}</code>' in cell(page, "base")
    # A lone surrogate (JavaScript strings may hold one) is shown as its escape, not a failed render.
    assert '<code class="observed">\\ud800</code>' in cell(page, "candidate")


def test_the_procedure_reads_as_sentences_without_unset_fields(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    bundle = store_cart_bundle(store, solid_png(2, 2, (0, 0, 0)), solid_png(2, 2, (9, 9, 9)))
    # Stored as the validated model's JSON, so every unset comparison is there as null.
    assert b'"contains": null' in store.read_bytes(bundle.procedure)
    steps = section(render_report(bundle, store, tmp_path / "report").read_text(), "steps")

    assert "None" not in steps and "null" not in steps
    items = re.findall(r"<li>(.*?)</li>", steps)
    assert items == [
        '<code class="action">goto</code> open <code>/</code> <span class="note">within 15000 ms</span>',
        '<code class="action">wait_for</code> wait until <code>#total</code> is visible '
        '<span class="note">within 5000 ms</span>',
        '<code class="action">expect_text</code> the text of <code>#cart</code> contains '
        '<code>Green tea 3 $4.50 $13.50</code> <span class="note">within 5000 ms</span>',
        '<code class="action">expect_response_status</code> the latest response to <code>/</code> has status '
        '<code>200</code> <span class="note">within 5000 ms</span>',
        '<code class="action">expect_text</code> the text of <code>#total</code> is not <code>$40.00</code> '
        '<span class="note">within 5000 ms</span>',
    ]
    assert "<h3>The bug is present when all of these hold</h3>" in steps
    # The procedure in the reporter's own shape, unset fields left out.
    bug_present = "bug_present:\n- action: expect_text\n  selector: &#x27;#total&#x27;\n  not_equals: $40.00\n"
    assert bug_present + "  timeout_ms: 5000\nruns: 2\n</pre>" in steps


def test_a_run_that_stopped_at_a_step_and_an_unreadable_log_are_said_so(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    bundle = store_cart_bundle(store, solid_png(2, 2, (0, 0, 0)), solid_png(2, 2, (9, 9, 9)))
    stopped = {
        "runs": [
            {"run": 1, "outcome": {"bug_present": False, "failed_step": 1, "error": "step 2 (wait_for): timeout"}},
            {"run": 2, "outcome": None},
        ]
    }
    base_log = store.put_bytes(json.dumps(stopped).encode(), kind=ArtifactKind.LOG, run_id="r", name="log.json")
    not_json = store.put_bytes(b"\x89PNG", kind=ArtifactKind.LOG, run_id="r", name="log.json")
    bundle.base.logs[:] = [base_log]
    bundle.candidate.logs[:] = [not_json]
    page = render_report(bundle, store, tmp_path / "report").read_text()

    base = cell(page, "base")
    assert '<span class="verdict fail">not evaluated</span> <span class="note">run 1</span>' in base
    assert "not evaluated: step 2 (wait_for): timeout" in base
    assert "the run ended before it had an outcome (cancelled, or the browser failed)" in base
    assert "not recorded: log.json is not JSON" in cell(page, "candidate")


def test_runs_that_saw_different_values_are_listed_apart(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    bundle = store_cart_bundle(store, solid_png(2, 2, (0, 0, 0)), solid_png(2, 2, (9, 9, 9)))
    seen = {1: ("$23.75", True), 2: ("$40.00", False), 3: ("$23.75", True)}
    runs = [
        {"run": run, "outcome": {"bug_present": holds, "assertions": [{"index": 0, "holds": holds, "actual": actual}]}}
        for run, (actual, holds) in seen.items()
    ]
    log = store.put_bytes(json.dumps({"runs": runs}).encode(), kind=ArtifactKind.LOG, run_id="r", name="log.json")
    bundle.base.logs[:] = [log]
    base = cell(render_report(bundle, store, tmp_path / "report").read_text(), "base")

    entries = re.findall(r'<div class="seen">(.*?)</div>', base)
    assert entries == [
        '<code class="observed">$23.75</code> <span class="verdict pass">holds</span> '
        '<span class="note">runs 1, 3</span>',
        '<code class="observed">$40.00</code> <span class="verdict fail">does not hold</span> '
        '<span class="note">run 2</span>',
    ]


def test_identical_screenshots_are_embedded_once_and_the_repeat_links_to_them(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    bundle = store_cart_bundle(store, solid_png(8, 4, (200, 0, 0)), solid_png(8, 4, (0, 160, 0)))
    first = next(r for r in bundle.base.screenshots if r.name.endswith("-run-1-assert-1.png"))
    page = render_report(bundle, store, tmp_path / "report").read_text()
    shots = section(page, "reproduction")

    assert shots.count(base64.b64encode(store.read_bytes(first)).decode()) == 1
    # Inside the base revision's column, at the moment of run 2's check.
    base = shots[shots.index('id="side-base"') : shots.index('id="side-candidate"')]
    repeat = re.search(r'<div class="cell shot" data-moment="run-2-assert-1.png" [^>]*>(.*?)</div>', base, re.S)
    assert repeat is not None
    assert f'same image as <a href="#shot-base-{first.sha256[:16]}">run 1: check 1</a>' in repeat.group(1)
    assert "reproduce-base-run-2-assert-1.png" in repeat.group(1)
    assert '<div class="moment" style="grid-area:4/1">run 2: check 1</div>' in shots


def test_text_from_artifacts_cannot_inject_markup(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    bundle = store_cart_bundle(store, solid_png(2, 2, (0, 0, 0)), solid_png(2, 2, (9, 9, 9)))
    page = render_report(bundle, store, tmp_path / "report").read_text()
    assert "<script" not in page
    assert "&lt;/pre&gt;&lt;script&gt;alert(&quot;patched&quot;)&lt;/script&gt;" in page
    assert "script-src" not in page and "default-src 'none'" in page


def test_report_refuses_to_show_tampered_evidence(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    bundle = store_cart_bundle(store, solid_png(2, 2, (0, 0, 0)), solid_png(2, 2, (9, 9, 9)))
    shot = store.object_path(bundle.candidate.screenshots[0].key)
    shot.chmod(0o644)
    shot.write_bytes(solid_png(2, 2, (255, 255, 255)))
    with pytest.raises(IntegrityError):
        render_report(bundle, store, tmp_path / "report")


@pytest.mark.browser
@pytest.mark.slow
def test_served_report_renders_in_chromium_with_images_and_no_console_errors(tmp_path: Path, chromium: Browser) -> None:
    page = chromium.new_page()
    page.set_content('<p style="font:40px sans-serif;color:#a40e26">Total: $23.75</p>')
    base_png = page.screenshot()
    page.set_content('<p style="font:40px sans-serif;color:#116329">Total: $40.00</p>')
    candidate_png = page.screenshot()
    page.close()

    with served(make_server(tmp_path / "store")) as server:
        store = LocalArtifactStore(tmp_path / "store", public_url=server.url)
        bundle = store_cart_bundle(store, base_png, candidate_png)
        html = render_report(bundle, store, tmp_path / "report")
        report = store.put_file(html, kind=ArtifactKind.REPORT, run_id=bundle.run_id, name="evidence.html")

        page = chromium.new_page()
        problems = watched(page)
        page.on("requestfailed", lambda req: problems.append(f"request failed: {req.url}"))
        opened(page, store.url_for(report))

        widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
        assert len(widths) == 4 and all(w > 0 for w in widths)
        assert BASE[:12] in page.inner_text("#side-base")
        assert CANDIDATE[:12] in page.inner_text("#side-candidate")
        # Each revision's own column holds its screenshots and names its revision.
        for side, revision in (("base", BASE), ("candidate", CANDIDATE)):
            shown = page.eval_on_selector_all(f"#side-{side} img", "imgs => imgs.map(i => i.naturalWidth)")
            assert len(shown) == 1 and shown[0] > 0
            assert page.get_attribute(f"#side-{side}", "data-revision") == revision
        assert page.inner_text("#verdict") == "all checks passed"
        assert page.inner_text("#bundle-digest") == bundle_digest(bundle)
        assert problems == []

        trace_href = page.get_attribute("#traces a", "href")
        assert trace_href is not None
        assert httpx.get(trace_href, timeout=10).content == store.read_bytes(bundle.base.traces[0])

        page.goto(server.url + "/", wait_until="load")
        assert page.get_attribute("ul a", "href") == f"/a/{report.key}"
        page.close()


NAME = "t\N{INFORMATION DESK PERSON}t"
HOSTILE = "<script>alert(1)</script>"
ISSUE = f"""A name that ends in an emoji grows a stray asterisk.

```durafix-repro
version: 1
name: emoji names keep their last character and nothing more
steps:
  - action: goto
    path: /profile
  - action: wait_for
    selector: "#name"
bug_present:
  - action: expect_text
    selector: "#name"
    not_equals: "{NAME}"
  - action: expect_text
    selector: "#bio"
    contains: alert
runs: 2
```
"""


def profile(name: str) -> dict[str, str]:
    """One revision of a profile page; its bio is text a hostile user wrote."""
    body = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>profile</title></head><body>'
        f'<h1 id="name" style="font:32px sans-serif">{html.escape(name)}</h1>'
        f'<p id="bio">{html.escape(HOSTILE)}</p></body></html>'
    )
    return {"/": "<p>up</p>", "/profile": body}


@pytest.mark.browser
@pytest.mark.slow
def test_a_reproduced_and_fixed_bug_report_shows_each_revisions_values_and_crops_in_chromium(
    tmp_path: Path, chromium: Browser
) -> None:
    executable = chromium_path()
    with served(make_server(tmp_path / "store")) as server:
        store = LocalArtifactStore(tmp_path / "store", public_url=server.url)
        with (
            BrowserRunner(executable_path=executable) as runner,
            serve_static(profile(NAME + "*")) as base_url,
            serve_static(profile(NAME)) as candidate_url,
        ):
            # The browser queue's own activities: the procedure from the report, then each revision's
            # reproduction stored as a worker stores it.
            activities = BrowserActivities(store, lambda: runner)
            prepared = ActivityEnvironment().run(
                activities.prepare_procedure, PrepareProcedureInput(run_id=RUN_ID, report_body=ISSUE)
            )
            assert prepared.procedure_ref is not None, prepared.error
            reproduced = {}
            for label, revision, url in (("base", BASE, base_url), ("candidate-1", CANDIDATE, candidate_url)):
                environment = EnvironmentHandle(
                    env_id=f"env-{label}", provider="local", run_id=RUN_ID, op_id=f"env-{label}", base_url=url
                )
                inp = ReproduceInput(
                    run_id=RUN_ID,
                    op_id=op_id(RUN_ID, f"reproduce-{label}", 1),
                    revision=revision,
                    procedure_ref=prepared.procedure_ref,
                    environment=environment,
                )
                reproduced[label] = ActivityEnvironment().run(activities.reproduce, inp)
        base, candidate = reproduced["base"], reproduced["candidate-1"]
        assert base.status == ReproductionStatus.REPRODUCED, base.detail
        assert candidate.status == ReproductionStatus.NOT_REPRODUCED, candidate.detail

        patch = store.put_bytes(b"-    return name + '*'\n+    return name\n", kind=ArtifactKind.PATCH, run_id=RUN_ID)
        bundle = run_bundle(
            prepared.procedure_ref,
            RevisionEvidence.from_refs("base", BASE, base.status.value, base.artifacts, detail=base.detail),
            RevisionEvidence.from_refs(
                "candidate", CANDIDATE, candidate.status.value, candidate.artifacts, detail=candidate.detail
            ),
            patch,
            repository="acme/people",
            issue_number=12,
        )
        crops = [r for r in bundle.base.screenshots + bundle.candidate.screenshots if r.name.endswith("-element.png")]
        # Two runs of two checks on each revision; the app's own screenshots draw the emoji in colour.
        assert len(crops) == 8
        name_crop = next(r for r in bundle.base.screenshots if r.name == "reproduce-base-run-1-assert-1-element.png")
        assert colourful_pixels(store.read_bytes(name_crop)) > 50

        rendered = render_report(bundle, store, tmp_path / "report")
        report = store.put_file(rendered, kind=ArtifactKind.REPORT, run_id=RUN_ID, name="evidence.html")
        # Wider than a screenshot, so "full size" is the screenshot's own width.
        page = chromium.new_page(viewport={"width": 1400, "height": 1000})
        problems = watched(page)
        page.on("dialog", lambda dialog: problems.append(f"dialog: {dialog.message}"))
        opened(page, store.url_for(report))

        def observed(role: str, check: int) -> str:
            return page.inner_text(f'#proof td[data-role="{role}"][data-check="{check}"] code.observed')

        assert observed("base", 1) == NAME + "*" and observed("candidate", 1) == NAME
        assert page.inner_text('#proof td[data-role="base"][data-check="1"] .verdict') == "holds"
        assert page.inner_text('#proof td[data-role="candidate"][data-check="1"] .verdict') == "does not hold"
        # The hostile bio is shown as the text it is, on both revisions, and nothing of it runs.
        assert observed("base", 2) == HOSTILE and observed("candidate", 2) == HOSTILE
        assert page.locator("script").count() == 0
        # The report draws the emoji in colour too.
        value = page.locator('#proof td[data-role="base"][data-check="1"] code.observed').screenshot()
        assert colourful_pixels(value) > 20

        crop_images = page.locator("#proof img")
        assert crop_images.count() == 4
        sizes = crop_images.evaluate_all("imgs => imgs.map(i => [i.complete ? i.naturalWidth : 0, i.naturalHeight])")
        assert all(0 < width < 1280 and 0 < height < 200 for width, height in sizes)
        alts = crop_images.evaluate_all("imgs => imgs.map(i => i.alt)")
        assert alts[0] == "base revision, run 1, check 1: the element it read"

        # A crop opens full size on click, and closes on the next.
        crop = crop_images.first
        crop.click()
        assert page.evaluate("location.hash").startswith("#shot-base-")
        assert crop.evaluate("i => getComputedStyle(i).position") == "fixed"
        page.mouse.click(5, 5)
        assert crop.evaluate("i => getComputedStyle(i).position") == "static"
        # "the whole page" opens the screenshot of the page at that check, at its full width.
        page.click('#proof td[data-role="candidate"][data-check="1"] a.page')
        whole = page.locator(f"{page.evaluate('location.hash')} img")
        assert whole.evaluate("i => getComputedStyle(i).position") == "fixed"
        assert whole.evaluate("i => [i.clientWidth, i.naturalWidth]") == [1280, 1280]
        assert problems == []
        page.close()
