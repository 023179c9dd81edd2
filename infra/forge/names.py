"""Which owner, repository and ref names the forge accepts, and the clock it stamps objects with.

Names reach the file system (``DATA/repos/OWNER/REPO.git``) and git (``update-ref``), so anything that could
escape the data dir or confuse git is refused before it is used: ``..``, absolute paths, separators and
control characters in owner/repo names, and every ref name git's ``check-ref-format`` would reject.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

_LOGIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38}$")
_REPO = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
_REF_BAD_CHARS = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


def valid_login(login: str) -> bool:
    return bool(_LOGIN.match(login))


def valid_repo_name(name: str) -> bool:
    return bool(_REPO.match(name)) and name not in (".", "..") and not name.lower().endswith(".git")


def valid_ref(ref: str) -> bool:
    """A full ref name (``refs/...``) that git accepts and that stays inside ``refs/``."""
    if not ref.startswith("refs/") or ref.count("/") < 2:
        return False
    if _REF_BAD_CHARS.search(ref) or ".." in ref or "@{" in ref or "//" in ref:
        return False
    if ref.endswith(("/", ".", ".lock")) or ref == "@":
        return False
    return all(part and not part.startswith(".") and not part.endswith(".lock") for part in ref.split("/"))


def valid_branch(name: str) -> bool:
    return valid_ref(f"refs/heads/{name}")


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
