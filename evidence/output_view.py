"""A command's output as the report shows it: escaped, cut to a readable size, with the lines a check read
marked.

Output is whatever the repository's code wrote (already decoded, invalid UTF-8 replaced): it can be huge,
hold one endless line, or hold markup. Only the first :data:`MAX_LINES` lines are shown, each cut at
:data:`MAX_LINE_CHARS` characters, at most :data:`MAX_CHARS` characters in all; what is left out is said in
a note beside the link to the whole record.

Which lines a check read is worked out on the whole text, as the check itself compared it: ``contains``
marks the lines holding each occurrence, ``matches`` the lines of each match (by RE2, linear in the text,
as the runner evaluates it), ``equals`` the whole output when it is equal. ``not_equals`` reads the whole
text and holds because nothing matched, so it marks nothing.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, field
from typing import Any

import re2

from evidence.markup import esc

MAX_LINES = 200
MAX_LINE_CHARS = 2_000
MAX_CHARS = 20_000
# More marks than this in one output say nothing more to a reader.
_MAX_HITS = 1_000
_RE2_MAX_MEM = 8 << 20
_RE2_MAX_PATTERN_CHARS = 500


@dataclass
class Marks:
    """The checks (1-based numbers) that read each line (0-based) of one output."""

    by_line: dict[int, list[int]] = field(default_factory=dict)

    def add(self, line: int, check: int) -> None:
        numbers = self.by_line.setdefault(line, [])
        if check not in numbers:
            numbers.append(check)


def lines_read(text: str, how: str, operand: str) -> list[int]:
    """The 0-based lines of ``text`` holding what comparison ``how`` with ``operand`` found there."""
    spans: list[tuple[int, int]] = []
    if how == "contains" and operand:
        start = text.find(operand)
        while start >= 0 and len(spans) < _MAX_HITS:
            spans.append((start, start + len(operand)))
            start = text.find(operand, start + max(len(operand), 1))
    elif how == "matches":
        pattern = _compiled(operand)
        if pattern is not None:
            for found in pattern.finditer(text):
                spans.append(found.span())
                if len(spans) >= _MAX_HITS:
                    break
    elif how == "equals" and text.rstrip() == operand.rstrip() and text.rstrip():
        spans.append((0, len(text.rstrip())))
    starts = [0, *(i + 1 for i, ch in enumerate(text) if ch == "\n")]
    lines: set[int] = set()
    for start, end in spans:
        if start >= len(text) and text.endswith("\n"):
            # The end of the text, after its last newline, is on the last line shown, not an empty one after it.
            start = len(text) - 1
        first = bisect.bisect_right(starts, start) - 1
        last = bisect.bisect_right(starts, max(start, end - 1)) - 1
        lines.update(range(first, last + 1))
    return sorted(lines)


@functools.lru_cache(maxsize=64)
def _compiled(pattern: str) -> Any:
    """``pattern`` compiled by RE2, or None when it cannot be (the runner refused it then too)."""
    if len(pattern) > _RE2_MAX_PATTERN_CHARS:
        return None
    options = re2.Options()
    options.log_errors = False
    options.max_mem = _RE2_MAX_MEM
    try:
        return re2.compile(pattern, options)
    except re2.error:
        return None


@dataclass(frozen=True)
class ShownOutput:
    """An output as HTML (``<pre>``), and what of it was left out (``None`` when nothing was)."""

    html: str
    left_out: str | None
    # Checks that read a line beyond the shown ones: (check number, first such line, 1-based).
    unshown_marks: list[tuple[int, int]]


def show_output(text: str, marks: Marks, stream: str) -> ShownOutput:
    """``text`` as a ``<pre>`` of its first lines, the lines in ``marks`` in ``<mark>`` elements."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    shown: list[str] = []
    chars = 0
    long_lines = 0
    for number, line in enumerate(lines):
        if number >= MAX_LINES or chars >= MAX_CHARS:
            break
        budget = min(MAX_LINE_CHARS, MAX_CHARS - chars)
        cut = line[:budget]
        chars += len(cut)
        rest = f'<span class="cut"> … {len(line) - len(cut)} more characters</span>' if len(cut) < len(line) else ""
        long_lines += bool(rest)
        checks = marks.by_line.get(number)
        if checks:
            numbers = " ".join(str(c) for c in checks)
            shown.append(f'<mark data-check="{numbers}" title="read by check {numbers}">{esc(cut)}</mark>{rest}')
        else:
            shown.append(f"{esc(cut)}{rest}")
    left = len(lines) - len(shown)
    notes = []
    if left:
        notes.append(f"the first {len(shown)} of {len(lines)} lines are shown")
    if long_lines:
        notes.append(f"{long_lines} long {'line is' if long_lines == 1 else 'lines are'} cut")
    unshown: dict[int, int] = {}
    for number, checks in sorted(marks.by_line.items()):
        if number >= len(shown):
            for check in checks:
                unshown.setdefault(check, number + 1)
    body = "\n".join(shown)
    data = f' data-stream="{esc(stream)}"'
    return ShownOutput(
        html=f'<pre class="output"{data}>{body}</pre>' if shown else f'<p class="note">no {esc(stream)}</p>',
        left_out="; ".join(notes) or None,
        unshown_marks=sorted(unshown.items()),
    )
