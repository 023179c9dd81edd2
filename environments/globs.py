"""Path globs, as the patch policy (protected paths, test globs) and the recipe's ``test_files`` read them.

A pattern is matched against a whole repository path (``/``-separated, no leading ``/``), case-insensitively
(a stricter match refuses more, never less): ``*`` matches within one segment, ``?`` one character of a
segment, ``**`` any number of segments (``.github/**`` is everything under ``.github``, ``**/Jenkinsfile``
a ``Jenkinsfile`` at any depth, the root included). A pattern without ``/`` matches at the root only, as in
``.gitlab-ci.yml``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable


@functools.lru_cache(maxsize=512)
def _compile(pattern: str) -> re.Pattern[str]:
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out), re.IGNORECASE | re.DOTALL)


def glob_matches(pattern: str, path: str) -> bool:
    """Whether ``path`` matches ``pattern`` (rules in the module's documentation)."""
    return _compile(pattern.strip("/")).fullmatch(path) is not None


def matches_any(path: str, patterns: Iterable[str]) -> str | None:
    """The first of ``patterns`` that ``path`` matches, or ``None``."""
    return next((pattern for pattern in patterns if glob_matches(pattern, path)), None)
