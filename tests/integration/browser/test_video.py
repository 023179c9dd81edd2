"""Video of a reproduction, encoded by the system ffmpeg (nothing downloaded), checked with ffprobe."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from browser.procedure import parse_procedure
from browser.results import ReproductionStatus
from browser.runner import BrowserRunner
from browser.session import VIDEO_SIZE
from browser.video import VideoUnavailable, enable_video, ffmpeg_revision, prepare_browsers_path
from tests.conftest import require
from tests.support.browser_apps import CART_DIR

pytestmark = pytest.mark.browser

CART = parse_procedure((CART_DIR / "repro.yaml").read_text())


@pytest.fixture(scope="module")
def video_runner(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserRunner]:
    require(shutil.which("ffmpeg") is not None, "ffmpeg is not installed (apt-get install ffmpeg)")
    with BrowserRunner(executable_path=chromium, video_dir=tmp_path_factory.mktemp("browsers")) as kept:
        yield kept


def probe(video: Path) -> dict[str, str]:
    shown = subprocess.run(
        ["ffprobe", "-v", "error", "-print_format", "json", "-show_format", "-show_streams", str(video)],
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(shown.stdout)
    stream = data["streams"][0]
    return {
        "codec": stream["codec_name"],
        "size": f"{stream['width']}x{stream['height']}",
        "duration": data["format"]["duration"],
    }


def test_each_run_leaves_a_playable_webm_video(video_runner: BrowserRunner, cart_url: str, tmp_path: Path) -> None:
    result = video_runner.run(CART, cart_url, tmp_path / "out")

    assert result.status == ReproductionStatus.REPRODUCED, result.detail
    assert [p.name for p in result.video_paths] == [f"run-{n}-video.webm" for n in range(1, CART.runs + 1)]
    for video in result.video_paths:
        found = probe(video)
        assert found["codec"] == "vp9"
        assert found["size"] == f"{VIDEO_SIZE['width']}x{VIDEO_SIZE['height']}"
        assert float(found["duration"]) > 0
    # Playwright's own working folders are gone: only the named videos remain.
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".run-")]


def test_without_video_no_video_is_recorded(runner: BrowserRunner, cart_url: str, tmp_path: Path) -> None:
    result = runner.run(CART, cart_url, tmp_path / "out")

    assert result.status == ReproductionStatus.REPRODUCED, result.detail
    assert result.video_paths == []
    assert not list((tmp_path / "out").glob("*.webm"))


def test_browsers_path_links_the_system_ffmpeg_under_playwrights_revision(tmp_path: Path) -> None:
    require(shutil.which("ffmpeg") is not None, "ffmpeg is not installed (apt-get install ffmpeg)")
    folder = prepare_browsers_path(tmp_path)
    link = folder / f"ffmpeg-{ffmpeg_revision()}" / "ffmpeg-linux"
    assert link.resolve() == Path(shutil.which("ffmpeg") or "").resolve()
    # Idempotent.
    assert prepare_browsers_path(tmp_path) == folder and link.is_symlink()


def test_video_without_ffmpeg_is_refused_at_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("PLAYWRIGHT_BROWSERS_PATH", raising=False)
    with pytest.raises(VideoUnavailable, match="apt-get install ffmpeg"):
        enable_video(tmp_path / "browsers")
