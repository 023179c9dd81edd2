"""How many test cases a test file holds (which files are tests: :mod:`environments.test_files`, re-exported
here as :func:`is_test_file`).

:func:`count_test_cases` is deliberately simple and documented, so anyone can predict it:

- Python: every ``def test*`` / ``async def test*`` in the module (at any depth, so methods of test
  classes count), read with :mod:`ast`, except those decorated with a ``skip`` / ``skipif`` / ``xfail``
  marker. A file that no longer parses counts zero.
- JavaScript / TypeScript: calls ``it(``, ``test(``, ``it.only(``, ``test.only(``, ``it.concurrent(``,
  ``test.concurrent(``, ``it.each(...)(`` / ``test.each(...)(`` (counted once); ``it.skip``, ``xit``,
  ``test.todo`` and friends do not count. Comments are not stripped: the count compares two versions of
  the same file, so a miscount made on both sides cancels out.
- Go: ``func Test...(`` declarations.
- Anything else: ``None`` (unknown); such a file is protected against deletion only.
"""

from __future__ import annotations

import ast
import re
from pathlib import PurePosixPath

from environments.test_files import JS_EXTENSIONS, is_test_file

__all__ = ["count_test_cases", "is_test_file"]

_JS_CASE = re.compile(r"(?<![\w$.])(?:it|test)(?:\.only|\.concurrent)?\s*\(|(?<![\w$.])(?:it|test)\.each\b")
_GO_CASE = re.compile(r"^func\s+Test\w*\s*\(", re.MULTILINE)
_SKIP_MARKERS = frozenset({"skip", "skipif", "xfail", "skipIf", "skipUnless", "expectedFailure"})


def count_test_cases(path: str, content: bytes) -> int | None:
    """How many test cases ``content`` (the file at ``path``) declares, or ``None`` for a language the
    count does not know (see the module's documentation for the rules)."""
    suffix = PurePosixPath(path).suffix.lower()
    text = content.decode("utf-8", errors="replace")
    if suffix == ".py":
        return _python_cases(text)
    if suffix in JS_EXTENSIONS:
        return len(_JS_CASE.findall(text))
    if suffix == ".go":
        return len(_GO_CASE.findall(text))
    return None


def _python_cases(text: str) -> int:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return 0
    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test")
        and not any(_is_skip(decorator) for decorator in node.decorator_list)
    )


def _is_skip(decorator: ast.expr) -> bool:
    """``@pytest.mark.skip``, ``@pytest.mark.skipif(...)``, ``@unittest.skip(...)``, ``@xfail``, ..."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = target.attr if isinstance(target, ast.Attribute) else target.id if isinstance(target, ast.Name) else ""
    return name in _SKIP_MARKERS
