"""The evidence server as a real process: artifacts by key, integrity, the report index, clean stop."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from evidence.interface import ArtifactKind
from evidence.local import LocalArtifactStore
from tests.support.served import started_printing_url


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[LocalArtifactStore, str]]:
    root = tmp_path / "store"
    store = LocalArtifactStore(root)
    proc, url = started_printing_url([sys.executable, "-m", "evidence.serve", "--root", str(root), "--port", "0"])
    try:
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.stderr else ""
        yield store, url
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0


def test_artifact_is_served_by_key_with_its_media_type(served: tuple[LocalArtifactStore, str]) -> None:
    store, url = served
    ref = store.put_bytes(b"\x89PNG fake", kind=ArtifactKind.SCREENSHOT, run_id="r", media_type="image/png")
    response = httpx.get(f"{url}/a/{ref.key}", timeout=5)
    assert response.status_code == 200
    assert response.content == b"\x89PNG fake"
    assert response.headers["content-type"] == "image/png"
    assert response.headers["etag"] == f'"{ref.sha256}"'
    head = httpx.head(f"{url}/a/{ref.key}", timeout=5)
    assert head.status_code == 200 and head.headers["content-length"] == str(ref.size)
    assert httpx.get(f"{url}/healthz", timeout=5).text == "ok\n"


def test_tampered_artifact_is_refused_not_served(served: tuple[LocalArtifactStore, str]) -> None:
    store, url = served
    ref = store.put_bytes(b"honest log", kind=ArtifactKind.LOG, run_id="r")
    path = store.object_path(ref.key)
    path.chmod(0o644)
    path.write_bytes(b"forged log")
    response = httpx.get(f"{url}/a/{ref.key}", timeout=5)
    assert response.status_code == 500
    assert b"forged" not in response.content


@pytest.mark.parametrize(
    ("path", "status"),
    [("/a/%2e%2e/%2e%2e/meta/x", 400), ("/a/log/00/" + "1" * 64, 400), ("/a/log/00/" + "0" * 64, 404), ("/nope", 404)],
)
def test_requests_outside_the_store_are_refused(served: tuple[LocalArtifactStore, str], path: str, status: int) -> None:
    _, url = served
    assert httpx.get(url + path, timeout=5).status_code == status


def test_index_lists_the_stored_reports(served: tuple[LocalArtifactStore, str]) -> None:
    store, url = served
    report = store.put_bytes(b"<!doctype html><p>report</p>", kind=ArtifactKind.REPORT, run_id="r", name="e.html")
    store.put_bytes(b"not a report", kind=ArtifactKind.LOG, run_id="r")
    page = httpx.get(url + "/", timeout=5).text
    assert f'href="/a/{report.key}"' in page
    assert page.count("<li>") == 1
