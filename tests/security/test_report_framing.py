"""No other page may frame an evidence report (clickjacking), wherever the report is stored.

The evidence server runs as a real process (``python -m evidence.serve``) over a local store and over a real
S3 server (SeaweedFS, which checks signatures): every report it serves carries a Content-Security-Policy with
``frame-ancestors 'none'`` beside the directives it always had, and ``X-Frame-Options: DENY``. A report
fetched from S3 through the server is checked against its key's sha256 first (a tampered object is refused).
In real Chromium, a page of another origin that frames the served report gets nothing of it, while the same
report opened directly renders. The same report opened from a presigned S3 URL frames fine: S3 sends no
Content-Security-Policy, which is why S3 stores link through the server when ``public_url`` names it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser

from evidence.interface import ArtifactKind, ArtifactRef
from evidence.local import LocalArtifactStore
from evidence.s3 import S3ArtifactStore, S3Credentials
from infra.s3 import SeaweedS3
from tests.support.browser_apps import serve_static
from tests.support.chromium import launched
from tests.support.evidence_stores import s3_server

__all__ = ["s3_server"]

MARKER = f"evidence report {uuid.uuid4().hex}"
REPORT = (
    '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>report</title></head>'
    f'<body><h1 id="marker">{MARKER}</h1><a href="#x">a link a framing page would want clicked</a></body></html>'
)
# What the server's policy held before framing was forbidden, and must still hold.
DIRECTIVES = (
    "default-src 'none'",
    "img-src data: 'self'",
    "style-src 'unsafe-inline'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
)


@dataclass
class Served:
    """A report in a store, and the evidence server (a real process) over that store."""

    store: LocalArtifactStore | S3ArtifactStore
    report: ArtifactRef
    url: str
    """The server's base URL."""


@contextmanager
def run_server(args: list[str], env: dict[str, str]) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "evidence.serve", *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.stderr else ""
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


@pytest.fixture(params=["local", pytest.param("seaweedfs", marks=pytest.mark.s3)])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    if request.param == "local":
        store: LocalArtifactStore | S3ArtifactStore = LocalArtifactStore(tmp_path / "store")
        report = store.put_bytes(REPORT.encode(), kind=ArtifactKind.REPORT, run_id="r", name="index.html")
        with run_server(["--root", str(tmp_path / "store")], {}) as url:
            yield Served(store, report, url)
        return
    s3: SeaweedS3 = request.getfixturevalue("s3_server")
    bucket = f"framing-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(bucket)
    credentials = S3Credentials(access_key_id=s3.access_key, secret_access_key=s3.secret_key)
    store = S3ArtifactStore(bucket, "runs", endpoint_url=s3.endpoint_url, credentials=credentials)
    report = store.put_bytes(REPORT.encode(), kind=ArtifactKind.REPORT, run_id="r", name="index.html")
    env = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
    with run_server(["--url", f"s3://{bucket}/runs?endpoint={s3.endpoint_url}"], env) as url:
        yield Served(store, report, url)


def assert_unframeable(response: httpx.Response) -> None:
    policy = response.headers["content-security-policy"]
    directives = [part.strip() for part in policy.split(";")]
    assert set(DIRECTIVES) <= set(directives), policy
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["x-content-type-options"] == "nosniff"


def test_a_served_report_carries_a_policy_that_no_page_may_frame_it(served: Served) -> None:
    response = httpx.get(f"{served.url}/a/{served.report.key}", timeout=10)
    assert response.status_code == 200
    assert response.content == REPORT.encode()
    assert response.headers["content-type"].startswith("text/html")
    assert_unframeable(response)
    # The answers that are not the report say the same: the index and a refusal.
    assert_unframeable(httpx.get(f"{served.url}/", timeout=10))
    missing = httpx.get(f"{served.url}/a/report/00/{'0' * 64}.html", timeout=10)
    assert missing.status_code == 404
    assert_unframeable(missing)
    assert served.report.key in httpx.get(f"{served.url}/", timeout=10).text


def new_bucket(s3_server: SeaweedS3) -> str:
    bucket = f"framing-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    return bucket


def runs_store(s3_server: SeaweedS3, bucket: str, public_url: str | None = None) -> S3ArtifactStore:
    """An S3 store of ``bucket`` under ``runs``, linking through ``public_url`` if given (else presigned)."""
    credentials = S3Credentials(access_key_id=s3_server.access_key, secret_access_key=s3_server.secret_key)
    return S3ArtifactStore(
        bucket, "runs", endpoint_url=s3_server.endpoint_url, credentials=credentials, public_url=public_url
    )


@pytest.mark.s3
def test_an_s3_store_links_through_the_server_and_a_tampered_object_is_refused(
    s3_server: SeaweedS3, tmp_path: Path
) -> None:
    bucket = new_bucket(s3_server)
    env = {"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}
    with run_server(["--url", f"s3://{bucket}/runs?endpoint={s3_server.endpoint_url}"], env) as url:
        store = runs_store(s3_server, bucket, public_url=url)
        report = store.put_bytes(REPORT.encode(), kind=ArtifactKind.REPORT, run_id="r", name="index.html")
        link = store.url_for(report)
        assert link == f"{url}/a/{report.key}"
        response = httpx.get(link, timeout=10)
        assert response.status_code == 200 and response.content == REPORT.encode()
        assert_unframeable(response)

        forged = REPORT.replace(MARKER, "forged report").encode()
        s3_server.client().put_object(Bucket=bucket, Key=f"runs/{report.key}", Body=forged, ContentType="text/html")
        refused = httpx.get(link, timeout=10)
        assert refused.status_code == 500
        assert b"forged" not in refused.content
        assert_unframeable(refused)


@pytest.fixture
def chromium() -> Iterator[Browser]:
    with launched() as browser:
        yield browser


def framed_text(chromium: Browser, report_url: str) -> tuple[str, list[str]]:
    """What of the report a page of another origin that frames it shows, and the console's messages."""
    attacker = f'<!doctype html><title>prize</title><iframe id="victim" src="{report_url}"></iframe>'
    with serve_static({"/": attacker}) as origin:
        page = chromium.new_page()
        messages: list[str] = []
        page.on("console", lambda msg: messages.append(msg.text))
        page.goto(origin + "/", wait_until="load")
        # Every frame's text, whatever its origin (Playwright reads across origins): a blocked frame holds the
        # browser's error page, an admitted one the report.
        text = "\n".join(frame.evaluate("() => document.body ? document.body.innerText : ''") for frame in page.frames)
        page.close()
    return text, messages


@pytest.mark.browser
def test_chromium_shows_nothing_of_a_served_report_to_a_page_that_frames_it(served: Served, chromium: Browser) -> None:
    link = f"{served.url}/a/{served.report.key}"
    page = chromium.new_page()
    page.goto(link, wait_until="load")
    assert page.inner_text("#marker") == MARKER  # opened directly, it renders
    page.close()

    text, messages = framed_text(chromium, link)
    assert MARKER not in text
    assert any("frame-ancestors 'none'" in message for message in messages), messages


@pytest.mark.browser
@pytest.mark.s3
def test_a_presigned_s3_link_frames_which_is_why_s3_links_go_through_the_server(
    s3_server: SeaweedS3, chromium: Browser
) -> None:
    store = runs_store(s3_server, new_bucket(s3_server))
    report = store.put_bytes(REPORT.encode(), kind=ArtifactKind.REPORT, run_id="r", name="index.html")
    presigned = store.url_for(report)
    assert "content-security-policy" not in httpx.get(presigned, timeout=10).headers
    text, _ = framed_text(chromium, presigned)
    assert MARKER in text
