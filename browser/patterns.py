"""Regular expressions from untrusted text (a procedure in an issue body), evaluated in linear time.

Python's ``re`` backtracks: ``(x+x+)+y`` against a few dozen characters takes seconds, holding the GIL, and
stalls every activity (and every heartbeat) on the worker. So every pattern a procedure carries is compiled
and searched with RE2 (PyPI ``google-re2``, imported as ``re2``), whose matching time is linear in the text
and whose compiled program is bounded in memory. RE2 has no backtracking-only features: a pattern using
backreferences, lookahead or lookbehind, atomic groups, possessive quantifiers or conditionals is refused
when the procedure is validated (:func:`validate_pattern`), with a message naming the syntax.

Inputs are capped too: a pattern is at most :data:`MAX_PATTERN_CHARS` characters, and a check reads at most
:data:`MAX_TEXT_CHARS` characters of page text (:mod:`browser.checks`).

Dialect notes (RE2 against Python's ``re``): ``\\d``, ``\\w`` and ``\\s`` are ASCII-only; ``\\Z`` is spelled
``\\z``; ``\\p{Greek}`` and POSIX classes (``[[:alpha:]]``) are supported; repetition counts are at most 1000.
"""

from __future__ import annotations

import functools
from typing import Any

import re2

MAX_PATTERN_CHARS = 500
# Larger than any value a procedure can hold (browser.procedure.MAX_PROCEDURE_CHARS), so an ``equals`` or
# ``not_equals`` comparison against capped text is never changed by the cap.
MAX_TEXT_CHARS = 100_000
# RE2's budget for one compiled pattern; a pattern whose program needs more is refused at validation.
_MAX_MEM = 8 << 20

# What RE2's parser says (its message starts with this), and the syntax a reporter wrote to cause it.
_UNSUPPORTED: tuple[tuple[str, str], ...] = (
    ("invalid perl operator: (?=", "lookahead (?=...)"),
    ("invalid perl operator: (?!", "negative lookahead (?!...)"),
    ("invalid perl operator: (?<=", "lookbehind (?<=...)"),
    ("invalid perl operator: (?<!", "negative lookbehind (?<!...)"),
    ("invalid perl operator: (?>", "atomic groups (?>...)"),
    ("invalid perl operator: (?(", "conditionals (?(...)...)"),
    # RE2 quotes only ``(?P`` for ``(?P=name)`` (a named backreference) and ``(?P>name)`` (recursion).
    ("invalid perl operator: (?P", "named backreferences or recursion (?P=name)"),
    ("invalid perl operator: (?#", "comments (?#...)"),
    ("bad repetition operator: ++", "possessive quantifiers (++)"),
    ("bad repetition operator: *+", "possessive quantifiers (*+)"),
    ("bad repetition operator: ?+", "possessive quantifiers (?+)"),
)


class PatternError(ValueError):
    """The pattern cannot be evaluated by the linear-time engine; the message says why."""


def _options() -> Any:
    options = re2.Options()
    # RE2 would also print every refused pattern to stderr; the refusal is reported to the caller instead.
    options.log_errors = False
    options.max_mem = _MAX_MEM
    return options


@functools.lru_cache(maxsize=256)
def compile_pattern(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (cached). Raises :class:`PatternError` saying which syntax is refused."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternError(f"regular expression is longer than {MAX_PATTERN_CHARS} characters")
    try:
        return re2.compile(pattern, _options())
    except re2.error as err:
        raise PatternError(_explain(pattern, err)) from err


def validate_pattern(pattern: str) -> str:
    """``pattern`` unchanged when RE2 can evaluate it; else :class:`PatternError`."""
    compile_pattern(pattern)
    return pattern


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` occurs anywhere in ``text`` (like ``re.search``), in time linear in ``text``.

    ``text`` beyond :data:`MAX_TEXT_CHARS` characters is not searched.
    """
    return compile_pattern(pattern).search(text[:MAX_TEXT_CHARS]) is not None


def _explain(pattern: str, err: Exception) -> str:
    raw = err.args[0] if err.args else ""
    reason = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    for prefix, syntax in _UNSUPPORTED:
        if reason.startswith(prefix):
            return f"regular expression {pattern!r} uses {syntax}, which is not supported (RE2 syntax, linear time)"
    if reason.startswith("invalid escape sequence: \\") and reason[-1:].isdigit():
        return (
            f"regular expression {pattern!r} uses a backreference ({reason.rsplit(' ', 1)[-1]}), which is not "
            "supported (RE2 syntax, linear time)"
        )
    if reason == "invalid escape sequence: \\Z":
        return f"invalid regular expression {pattern!r} (RE2 syntax): \\Z is spelled \\z (end of text)"
    if "pattern too large" in reason:
        return f"regular expression {pattern!r} is too large to evaluate in bounded memory"
    return f"invalid regular expression {pattern!r} (RE2 syntax): {reason}"
