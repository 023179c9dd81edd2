"""Video of a reproduction, encoded by the system's ffmpeg (Debian's ``ffmpeg`` package).

Playwright records a page by piping its screencast frames into an ffmpeg it normally downloads next to its
browsers (``$PLAYWRIGHT_BROWSERS_PATH/ffmpeg-<revision>/ffmpeg-linux``). Nothing is downloaded here: the
runner points Playwright's browsers path at a folder of our own in which that name links to the system
ffmpeg. Playwright asks ffmpeg for VP9 in WebM, so the system build must have the ``libvpx-vp9`` encoder.
Chromium itself is always given by path, so the browsers path only ever serves ffmpeg.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path

import playwright

BROWSERS_PATH_ENV = "PLAYWRIGHT_BROWSERS_PATH"
ENCODER = "libvpx-vp9"


class VideoUnavailable(RuntimeError):
    """Video was asked for but this host cannot encode it (no ffmpeg, or one without VP9)."""


@functools.cache
def ffmpeg_revision() -> str:
    """The ffmpeg revision the installed Playwright driver looks for (from its ``browsers.json``, read once:
    the installed driver does not change under a running process)."""
    manifest = Path(playwright.__file__).parent / "driver" / "package" / "browsers.json"
    for entry in json.loads(manifest.read_text())["browsers"]:
        if entry["name"] == "ffmpeg":
            return str(entry["revision"])
    raise VideoUnavailable(f"{manifest} names no ffmpeg revision")


def system_ffmpeg() -> Path:
    """The system ffmpeg, checked to have the encoder Playwright uses."""
    found = shutil.which("ffmpeg")
    if found is None:
        raise VideoUnavailable("video needs ffmpeg on PATH (apt-get install ffmpeg)")
    encoders = subprocess.run([found, "-hide_banner", "-encoders"], capture_output=True, text=True, timeout=30)
    if ENCODER not in encoders.stdout:
        raise VideoUnavailable(f"{found} has no {ENCODER} encoder, which Playwright's video recording uses")
    return Path(found)


def prepare_browsers_path(folder: Path) -> Path:
    """Make ``folder`` a Playwright browsers path whose ffmpeg is the system one; return ``folder``.

    Idempotent; safe to call from several processes at once (the link is replaced atomically).
    """
    ffmpeg = system_ffmpeg()
    slot = folder / f"ffmpeg-{ffmpeg_revision()}"
    slot.mkdir(parents=True, exist_ok=True)
    link = slot / "ffmpeg-linux"
    if not (link.is_symlink() and Path(os.readlink(link)) == ffmpeg):
        staging = slot / f".ffmpeg-linux.{os.getpid()}"
        staging.unlink(missing_ok=True)
        staging.symlink_to(ffmpeg)
        staging.replace(link)
    return folder


def enable_video(folder: Path) -> None:
    """Point this process's Playwright drivers (started after this call) at ``folder`` for ffmpeg.

    A browsers path set by the operator is respected when it already holds an ffmpeg.
    """
    current = os.environ.get(BROWSERS_PATH_ENV)
    if current and (Path(current) / f"ffmpeg-{ffmpeg_revision()}" / "ffmpeg-linux").exists():
        return
    os.environ[BROWSERS_PATH_ENV] = str(prepare_browsers_path(folder))
