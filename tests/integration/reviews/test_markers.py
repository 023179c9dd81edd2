"""Markers survive GitHub-style bodies: parsed back exactly, robust to spacing, order and foreign text."""

from __future__ import annotations

import subprocess

from reviews.markers import (
    COMMENT,
    TICKET,
    comment_marker,
    content_sha256,
    find_marker,
    parse_markers,
    ref_component,
    strip_markers,
    ticket_marker,
    with_marker,
)


def test_rendered_marker_parses_back_to_the_same_values_even_with_awkward_characters() -> None:
    op_id = "repair owner/repo#42:ticket -->"
    body = with_marker("Status: reproducing", ticket_marker(op_id))
    marker = find_marker(body, TICKET)
    assert marker is not None
    assert marker.attrs == {"op": op_id}
    assert "-->" not in body.split("<!--", 1)[1][:-3]


def test_parsing_tolerates_spacing_attribute_order_unknown_attributes_and_neighbours() -> None:
    body = (
        "text <!-- durafix:pr run=wf-1 -->\n"
        "<!--durafix:comment   sha256=abc  extra=1 key=wf-1%3Aevidence%3A1-->\n"
        "<!-- not ours -->"
    )
    kinds = [m.kind for m in parse_markers(body)]
    assert kinds == ["pr", "comment"]
    comment = find_marker(body, COMMENT)
    assert comment is not None
    assert comment.attrs == {"sha256": "abc", "extra": "1", "key": "wf-1:evidence:1"}


def test_with_marker_replaces_markers_already_in_the_body() -> None:
    body = with_marker(with_marker("hello", ticket_marker("a")), ticket_marker("b"))
    assert [m.attrs["op"] for m in parse_markers(body)] == ["b"]
    assert strip_markers(body) == "hello"


def test_content_hash_ignores_markers_and_line_ending_style() -> None:
    plain = "line one\nline two"
    marked = with_marker("line one\r\nline two", comment_marker("k", "x"))
    assert content_sha256(plain) == content_sha256(marked)
    assert content_sha256(plain) != content_sha256(plain + "!")


def test_ref_components_are_git_safe_and_distinct_for_distinct_names() -> None:
    names = ["wf-1:ticket", "wf-1-ticket", "wf 1/ticket", "..lock", "x.lock", "plain.name_1"]
    components = [ref_component(n) for n in names]
    assert len(set(components)) == len(names)
    assert ref_component("plain.name_1") == "plain.name_1"
    for component in components:
        checked = subprocess.run(["git", "check-ref-format", f"refs/durafix/claims/ticket/{component}"], check=False)
        assert checked.returncode == 0, component
