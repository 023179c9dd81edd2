"""One conditional ``git push --porcelain --force-with-lease``, and what its output means.

Both the branch publisher (:mod:`reviews.branches`) and the claim refs (:mod:`reviews.claims`) push this way;
they differ only in what a remote rejection means to them, so that judgement stays with the caller.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from reviews.errors import ForgePermanentError, ForgeTransientError

_AUTH_FAILURE = re.compile(r"returned error: (401|403|404)|Authentication failed|could not read Username", re.I)
_NOT_CONNECTED = re.compile(r"Failed to connect|Could not resolve host|Connection refused", re.I)
# The porcelain flags of a ref the remote took: fast-forward, forced, new, up to date.
_PUSHED_FLAGS = ("*", " ", "+", "=")


@dataclass(frozen=True)
class LeasedPush:
    """A finished push of ``ref``: git's exit code and its output."""

    ref: str
    returncode: int
    stdout: str
    stderr: str

    @property
    def status_line(self) -> str:
        """The porcelain line about ``ref`` (empty when git printed none, e.g. it never reached the remote)."""
        return next((line for line in self.stdout.splitlines() if f":{self.ref}\t" in line), "")

    @property
    def pushed(self) -> bool:
        """The remote now has the pushed commit at ``ref``."""
        return self.returncode == 0 and self.status_line[:1] in _PUSHED_FLAGS

    @property
    def rejection(self) -> str | None:
        """The remote's reason when it refused the ref (a stale lease, a declined hook, a failed lock); else None."""
        line = self.status_line
        return line.rsplit("\t", 1)[-1] if line.startswith("!") else None

    def failure(self, what: str) -> str:
        """For a push neither pushed nor rejected: raise :class:`ForgePermanentError` when authentication failed
        and :class:`ForgeTransientError` when git could not connect (``what`` names the push in the message);
        otherwise return a description, since only a read of the remote settles the outcome."""
        output = f"{self.stdout}\n{self.stderr}"
        if _AUTH_FAILURE.search(output):
            raise ForgePermanentError(f"{what} not authorised: {_last_line(self.stderr)}")
        if _NOT_CONNECTED.search(output):
            raise ForgeTransientError(f"{what} could not connect: {_last_line(self.stderr)}")
        return f"git push exited {self.returncode}: {_last_line(self.stderr)}"


def leased_push(
    git_url: str, sha: str, ref: str, expected: str | None, *, cwd: Path | str, env: Mapping[str, str], timeout_s: float
) -> LeasedPush | None:
    """Push ``sha`` to ``ref`` at ``git_url`` only if the remote has ``ref`` at ``expected`` (None: absent), with
    hooks off; None when git did not finish within ``timeout_s``. ``env`` is the child's whole environment (it
    carries the credentials, never the command line)."""
    try:
        done = subprocess.run(
            [
                "git",
                "push",
                "--porcelain",
                "--no-verify",
                f"--force-with-lease={ref}:{expected or ''}",
                git_url,
                f"{sha}:{ref}",
            ],
            cwd=cwd,
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None
    return LeasedPush(ref=ref, returncode=done.returncode, stdout=done.stdout, stderr=done.stderr)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
