"""Which lines of a command's output a check read, and how an output is cut for the page."""

from __future__ import annotations

from evidence.output_view import MAX_LINE_CHARS, Marks, lines_read, show_output

OUTPUT = "collecting\nTraceback (most recent call last):\n  File x\nValueError: bad\ndone\n"


def test_contains_marks_every_line_an_occurrence_spans() -> None:
    assert lines_read(OUTPUT, "contains", "Error") == [3]
    assert lines_read(OUTPUT, "contains", "x\nValueError") == [2, 3]
    assert lines_read("e e\ne", "contains", "e") == [0, 1]
    assert lines_read(OUTPUT, "contains", "absent") == []


def test_matches_marks_each_match_as_re2_finds_it() -> None:
    assert lines_read(OUTPUT, "matches", r"(?m)^\w+Error: .*$") == [3]
    assert lines_read(OUTPUT, "matches", r"last\):\s+File") == [1, 2]
    # A zero-width match marks the line it is on; the end of the text is on its last line.
    assert lines_read(OUTPUT, "matches", r"(?m)^") == [0, 1, 2, 3, 4]
    assert lines_read(OUTPUT, "matches", r"\z") == [4]
    # A pattern RE2 refuses (a backreference) marks nothing, as it matched nothing in the run.
    assert lines_read(OUTPUT, "matches", r"(a)\1") == []


def test_equals_marks_the_whole_output_only_when_it_is_equal_and_not_equals_marks_nothing() -> None:
    assert lines_read("3.0\n\n", "equals", "3.0") == [0]
    assert lines_read("a\nb\n", "equals", "a\nb") == [0, 1]
    assert lines_read("2.0\n", "equals", "3.0") == []
    assert lines_read("", "equals", "") == []
    assert lines_read("2.0\n", "not_equals", "3.0") == []


def test_shown_output_is_escaped_marked_and_cut() -> None:
    marks = Marks()
    marks.add(1, 2)
    marks.add(1, 3)
    marks.add(400, 1)
    text = "<b>\n" + "y" * (MAX_LINE_CHARS + 5) + "\n" + "z\n" * 500
    shown = show_output(text, marks, "stdout")
    assert shown.html.startswith('<pre class="output" data-stream="stdout">&lt;b&gt;\n<mark data-check="2 3"')
    assert '<span class="cut"> … 5 more characters</span>' in shown.html
    assert shown.left_out == "the first 200 of 502 lines are shown; 1 long line is cut"
    assert shown.unshown_marks == [(1, 401)]
    assert show_output("", Marks(), "stderr").html == '<p class="note">no stderr</p>'
