"""Which files of a repository are its tests: the recipe's ``test_files`` globs, or the common conventions.

A glob with a ``/`` is matched against the whole path (``*`` crosses directories, as in :mod:`fnmatch`); one
without is matched against the file's name. The conventions cover the usual layouts of Python, JavaScript and
TypeScript, Ruby, Go and Java projects; a repository with another layout declares its own in ``durafix.yaml``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase
from pathlib import PurePosixPath

DEFAULT_TEST_GLOBS: tuple[str, ...] = (
    "test/*",
    "tests/*",
    "spec/*",
    "__tests__/*",
    "*/test/*",
    "*/tests/*",
    "*/spec/*",
    "*/__tests__/*",
    "test_*.py",
    "*_test.py",
    "*.test.[jt]s",
    "*.spec.[jt]s",
    "*.test.[cm]js",
    "*.spec.[cm]js",
    "*.test.tsx",
    "*.spec.tsx",
    "*_spec.rb",
    "*_test.go",
    "*Test.java",
)


def is_test_file(path: str, globs: Sequence[str] = ()) -> bool:
    """Whether ``path`` (relative, ``/``-separated) is a test file by ``globs``, or by the conventions when
    ``globs`` is empty."""
    name = PurePosixPath(path).name
    return any(fnmatchcase(path, g) if "/" in g else fnmatchcase(name, g) for g in globs or DEFAULT_TEST_GLOBS)


def pick_test_files(paths: Iterable[str], globs: Sequence[str] = ()) -> list[str]:
    """The test files among ``paths``, sorted."""
    return sorted(p for p in set(paths) if is_test_file(p, globs))
