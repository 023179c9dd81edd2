"""Whether this host can run the browser queue: Chromium found and launchable the way the runner launches it.

:func:`chromium_version` finds Chromium as :class:`browser.runner.BrowserRunner` does (``executable`` or
:func:`browser.executable.find_chromium`), prepares the same launch plan (:class:`browser.sandbox.BrowserHome`:
as root with the sandbox on, the wrapper that drops to the browser's user) and runs that plan's executable
with ``--version`` in the plan's environment. That is cheap (no page, no profile) and catches what fails most
often on a new host: no Chromium, no ``setpriv``, no unprivileged user. It does not prove the sandbox's
namespaces work; the first launch does, and says how to proceed when they do not.
"""

from __future__ import annotations

import re
import subprocess

from browser.executable import INSTALL_HINT, find_chromium, not_installed
from browser.sandbox import DEFAULT_SANDBOX_USER, BrowserHome, SandboxUnavailable

# A cold ``chromium --version`` on two cores busy with test processes and builds has taken over 20 s; the check
# runs once, when a worker starts, so a generous bound costs nothing on a healthy host.
VERSION_TIMEOUT_S = 60.0


class ChromiumUnavailable(RuntimeError):
    """Chromium cannot be launched here; the message says what is missing and how to fix it."""


def chromium_version(
    executable: str | None = None,
    *,
    sandbox: bool = True,
    user: str = DEFAULT_SANDBOX_USER,
    video: bool = False,
) -> str:
    """``chromium 156.0.8078.114`` (what Chromium says of itself), or :class:`ChromiumUnavailable`.
    ``video``: also check the ffmpeg a recorded run needs (:func:`browser.video.system_ffmpeg`)."""
    found = executable or find_chromium()
    if found is None:
        raise ChromiumUnavailable(f"{not_installed()}; {INSTALL_HINT}")
    try:
        home = BrowserHome(found, sandbox=sandbox, user=user)
    except (SandboxUnavailable, OSError) as err:
        raise ChromiumUnavailable(f"cannot prepare chromium's sandbox: {err}") from err
    try:
        plan = home.plan
        result = subprocess.run(
            [plan.executable, "--version"],
            env=plan.env,
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ChromiumUnavailable(f"chromium ({found}) did not run: {err}; {INSTALL_HINT}") from err
    finally:
        home.remove()
    said = result.stdout.strip()
    if result.returncode != 0 or not said:
        detail = (result.stderr.strip() or said)[-300:]
        raise ChromiumUnavailable(f"chromium ({found}) did not run (exit {result.returncode}): {detail}")
    if video:
        # Imported only here: it loads Playwright, which a check without video does not need.
        from browser.video import VideoUnavailable, system_ffmpeg

        try:
            system_ffmpeg()
        except VideoUnavailable as err:
            raise ChromiumUnavailable(f"browser_video is on but {err}") from err
    return describe_version(said)


def describe_version(said: str) -> str:
    """``Chromium 156.0.8078.114 built on Debian ...`` -> ``chromium 156.0.8078.114``; else the first line."""
    match = re.search(r"(\d+(?:\.\d+){1,3})", said)
    return f"chromium {match.group(1)}" if match else said.splitlines()[0]
