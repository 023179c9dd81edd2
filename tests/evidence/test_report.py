"""The reviewer's report: content, escaping, integrity, and how it renders in real Chromium."""

from __future__ import annotations

import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, sync_playwright

from browser.runner import CHROMIUM_ARGS
from evidence.bundle import bundle_digest
from evidence.interface import ArtifactKind, IntegrityError
from evidence.local import LocalArtifactStore
from evidence.report import render_report
from evidence.serve import make_server
from tests.conftest import unavailable
from tests.evidence.samples import BASE, CANDIDATE, solid_png, store_cart_bundle


def test_report_shows_both_revisions_steps_patch_checks_and_hashes(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    bundle = store_cart_bundle(store, solid_png(8, 4, (200, 0, 0)), solid_png(8, 4, (0, 160, 0)))
    page = render_report(bundle, store, tmp_path / "report").read_text()

    assert BASE[:12] in page and CANDIDATE[:12] in page
    assert "reproduced: the bug is present" in page and "not reproduced: the bug is absent" in page
    assert len(re.findall(r'<img src="data:image/png;base64,', page)) == 2
    assert "<strong>goto</strong>" in page and "not_equals" in page
    assert '<span class="add">+    return sum(line_total(item) for item in items)' in page
    assert "4 passed in 0.03s" in page
    assert "playwright show-trace FILE" in page
    assert bundle_digest(bundle) in page
    for ref in bundle.artifacts():
        assert ref.sha256 in page


def test_identical_screenshots_are_shown_once_with_every_name(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    bundle = store_cart_bundle(store, solid_png(8, 4, (200, 0, 0)), solid_png(8, 4, (0, 160, 0)))
    again = store.put_bytes(
        solid_png(8, 4, (200, 0, 0)),
        kind=ArtifactKind.SCREENSHOT,
        run_id=bundle.run_id,
        name="run-2-assert-1.png",
        revision=BASE,
        media_type="image/png",
    )
    bundle.base.screenshots.append(again)
    page = render_report(bundle, store, tmp_path / "report").read_text()
    assert len(re.findall(r'<img src="data:image/png;base64,', page)) == 2
    assert "run-2-assert-1.png" in page and bundle.base.screenshots[0].name in page
    # Both names caption the one figure shown.
    assert f"<figcaption>{bundle.base.screenshots[0].name}, run-2-assert-1.png <span" in page


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


@pytest.fixture
def chromium() -> Iterator[Browser]:
    executable = shutil.which("chromium")
    if executable is None:
        unavailable("Debian chromium is not installed")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.mark.browser
@pytest.mark.slow
def test_served_report_renders_in_chromium_with_images_and_no_console_errors(tmp_path: Path, chromium: Browser) -> None:
    page = chromium.new_page()
    page.set_content('<p style="font:40px sans-serif;color:#a40e26">Total: $23.75</p>')
    base_png = page.screenshot()
    page.set_content('<p style="font:40px sans-serif;color:#116329">Total: $40.00</p>')
    candidate_png = page.screenshot()
    page.close()

    server = make_server(tmp_path / "store")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        store = LocalArtifactStore(tmp_path / "store", public_url=server.url)
        bundle = store_cart_bundle(store, base_png, candidate_png)
        html = render_report(bundle, store, tmp_path / "report")
        report = store.put_file(html, kind=ArtifactKind.REPORT, run_id=bundle.run_id, name="evidence.html")

        page = chromium.new_page()
        problems: list[str] = []
        page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda err: problems.append(str(err)))
        page.on("requestfailed", lambda req: problems.append(f"request failed: {req.url}"))
        response = page.goto(store.url_for(report), wait_until="load")
        assert response is not None and response.status == 200

        widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
        assert len(widths) == 2 and all(w > 0 for w in widths)
        assert BASE[:12] in page.inner_text("#side-base")
        assert CANDIDATE[:12] in page.inner_text("#side-candidate")
        assert page.inner_text("#verdict") == "all checks passed"
        assert page.inner_text("#bundle-digest") == bundle_digest(bundle)
        assert problems == []

        trace_href = page.get_attribute("#traces a", "href")
        assert trace_href is not None
        assert httpx.get(trace_href, timeout=10).content == store.read_bytes(bundle.base.traces[0])

        page.goto(server.url + "/", wait_until="load")
        assert page.get_attribute("ul a", "href") == f"/a/{report.key}"
        page.close()
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
