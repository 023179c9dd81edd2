"""Which Chromium executable the browser queue launches when none is configured.

Debian ships Chromium's headless build as ``chromium-headless-shell`` (the "old" headless mode, the one
Playwright itself launches for headless runs) beside the full browser ``chromium``. Both are the same
Chromium release; the shell has no browser UI to start, so a launch, a page and its close take about a
third of the full browser's CPU (0.27 s against 0.72 s per launch, driver included, on two cores). Every
run is headless, so the shell is preferred and the full browser is the fallback; ``executable_path=`` (and
the tests' own lookups) name one explicitly.
"""

from __future__ import annotations

import shutil

# In the order they are preferred; the first on ``PATH`` is launched.
CHROMIUM_EXECUTABLES = ("chromium-headless-shell", "chromium")
INSTALL_HINT = (
    "install Chromium's headless shell (Debian: apt-get install chromium-headless-shell) or Chromium "
    "(apt-get install chromium), or run the browser queue on a host that has it"
)


def find_chromium() -> str | None:
    """The first of :data:`CHROMIUM_EXECUTABLES` on ``PATH`` (its full path), or None when neither is."""
    for name in CHROMIUM_EXECUTABLES:
        found = shutil.which(name)
        if found is not None:
            return found
    return None


def not_installed() -> str:
    """What to say when :func:`find_chromium` found nothing."""
    return f"chromium is not installed (neither {' nor '.join(repr(n) for n in CHROMIUM_EXECUTABLES)} on PATH)"
