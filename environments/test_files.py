"""Which files of a repository are its tests: the common conventions, plus globs a repository or an operator names.

The conventions:

- a directory on the path named ``test``, ``tests``, ``__tests__``, ``spec`` or ``specs``;
- Python: ``test_*.py``, ``*_test.py``;
- JavaScript / TypeScript: ``*.test.*`` and ``*.spec.*`` with a ``js``, ``jsx``, ``ts``, ``tsx``, ``mjs``,
  ``cjs``, ``mts`` or ``cts`` extension;
- Go ``*_test.go``, Ruby ``*_spec.rb`` / ``*_test.rb``, Java / Kotlin ``*Test.java``, ``*Tests.java``,
  ``*Test.kt``.

Globs (:mod:`environments.globs`) add to them: the recipe's ``test_files`` for the regression proof, the
operator's ``test_globs`` for the patch policy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath

from environments.globs import matches_any

TEST_DIRECTORIES = frozenset({"test", "tests", "__tests__", "spec", "specs"})
JS_EXTENSIONS = frozenset({".js", ".jsx", ".ts", ".tsx", ".mjs", ".cjs", ".mts", ".cts"})
_NAMED_TESTS = re.compile(
    r"(?:^test_.*\.py|.*_test\.py|.*_test\.go|.*_spec\.rb|.*_test\.rb|.*Tests?\.java|.*Test\.kt)$"
)


def is_test_file(path: str, globs: Sequence[str] = ()) -> bool:
    """Whether ``path`` (relative, ``/``-separated, as git names it) is a test file.

    True by the conventions above or when it matches one of ``globs`` (``*`` within a path segment, ``**``
    across segments, matched case-insensitively; see :func:`environments.globs.glob_matches`).
    """
    pure = PurePosixPath(path)
    if any(part.lower() in TEST_DIRECTORIES for part in pure.parts[:-1]):
        return True
    name = pure.name
    if _NAMED_TESTS.match(name):
        return True
    stem = PurePosixPath(name)
    if stem.suffix.lower() in JS_EXTENSIONS and PurePosixPath(stem.stem).suffix.lower() in (".test", ".spec"):
        return True
    return matches_any(path, globs) is not None


def pick_test_files(paths: Iterable[str], globs: Sequence[str] = ()) -> list[str]:
    """The test files among ``paths``, sorted."""
    return sorted(p for p in set(paths) if is_test_file(p, globs))
