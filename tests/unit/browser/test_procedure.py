from __future__ import annotations

from pathlib import Path

import pytest

from browser.procedure import (
    ExpectText,
    Goto,
    Procedure,
    ProcedureError,
    WaitFor,
    extract_procedure,
    parse_procedure,
    procedure_digest,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "cart"

VALID = """\
version: 1
name: total is wrong
steps:
  - action: goto
    path: /
  - action: wait_for
    selector: "#total"
bug_present:
  - action: expect_text
    selector: "#total"
    not_equals: $40.00
"""


def refusal(text: str, first_line: int = 1) -> ProcedureError:
    """The error ``parse_procedure`` refuses ``text`` with."""
    with pytest.raises(ProcedureError) as raised:
        parse_procedure(text, first_line=first_line)
    return raised.value


def test_valid_yaml_parses_into_typed_steps_with_defaults() -> None:
    procedure = parse_procedure(VALID)
    assert procedure.steps == [
        Goto(action="goto", path="/"),
        WaitFor(action="wait_for", selector="#total", state="visible", timeout_ms=5000),
    ]
    assert procedure.bug_present == [ExpectText(action="expect_text", selector="#total", not_equals="$40.00")]
    assert procedure.runs == 1


def test_unknown_action_is_reported_at_its_line() -> None:
    error = refusal(VALID.replace("action: wait_for", "action: hover"))
    assert error.line == 6
    assert "steps.1" in str(error)
    assert "hover" in str(error)


def test_missing_selector_is_reported_at_the_step() -> None:
    error = refusal(VALID.replace('    selector: "#total"\nbug_present', "bug_present"))
    assert error.line == 6
    assert "steps.1.wait_for.selector: Field required" in str(error)


def test_misspelled_key_is_rejected_not_ignored() -> None:
    error = refusal(VALID.replace("    not_equals: $40.00", "    not_equals: $40.00\n    timout_ms: 10"))
    assert error.line == 12
    assert "timout_ms" in str(error)


def test_invalid_yaml_is_reported_with_its_line_in_the_source() -> None:
    error = refusal('version: 1\nname: x\nsteps: [\n  - action: "goto\n', first_line=40)
    assert error.line is not None and error.line >= 42
    assert "invalid YAML" in str(error)


def test_expect_text_needs_exactly_one_comparison() -> None:
    text = VALID.replace("    not_equals: $40.00", "    not_equals: $40.00\n    equals: $23.75")
    with pytest.raises(ProcedureError, match="exactly one of equals, not_equals, contains, matches"):
        parse_procedure(text)


@pytest.mark.parametrize("path", ["https://evil.example/", "//evil.example/x", "relative/page"])
def test_goto_cannot_leave_the_apps_base_url(path: str) -> None:
    with pytest.raises(ProcedureError, match="must start with a single '/'"):
        parse_procedure(VALID.replace("path: /", f"path: {path}"))


def test_invalid_regular_expression_is_rejected_at_validation() -> None:
    text = VALID.replace("not_equals: $40.00", 'matches: "([0-9"')
    with pytest.raises(ProcedureError, match="invalid regular expression"):
        parse_procedure(text)


def test_a_procedure_needs_at_least_one_bug_assertion_and_sane_runs() -> None:
    with pytest.raises(ProcedureError, match="bug_present"):
        parse_procedure(VALID.split("bug_present")[0] + "bug_present: []\n")
    with pytest.raises(ProcedureError, match="runs"):
        parse_procedure(VALID + "runs: 0\n")


def test_assertions_accept_only_expect_shapes() -> None:
    text = VALID.replace("action: expect_text", "action: click").replace("    not_equals: $40.00\n", "")
    with pytest.raises(ProcedureError, match=r"bug_present\.0"):
        parse_procedure(text)


def test_digest_ignores_spelling_but_not_content() -> None:
    spelled_differently = """\
name: total is wrong
version: 1
runs: 1
bug_present: [{action: expect_text, not_equals: $40.00, selector: "#total", timeout_ms: 5000}]
steps: [{action: goto}, {action: wait_for, selector: "#total", state: visible}]
"""
    assert procedure_digest(parse_procedure(spelled_differently)) == procedure_digest(parse_procedure(VALID))
    assert procedure_digest(parse_procedure(VALID + "runs: 2\n")) != procedure_digest(parse_procedure(VALID))


def test_extract_finds_the_tagged_block_and_skips_other_fences() -> None:
    body = f"Title words\n\n```yaml\nversion: 9\n```\n\n~~~ durafix-repro\n{VALID}~~~\n\nthanks\n"
    assert extract_procedure(body) == parse_procedure(VALID)


def test_extract_returns_none_without_a_block() -> None:
    assert extract_procedure("The total is wrong.\n\n```\nsome log\n```\n") is None


def test_extract_reports_errors_at_the_line_of_the_issue_body() -> None:
    body = "Broken cart\n\nSome words.\n\n```durafix-repro\n" + VALID.replace("wait_for", "wiat_for") + "```\n"
    with pytest.raises(ProcedureError) as raised:
        extract_procedure(body)
    assert raised.value.line == 11
    assert body.splitlines()[10] == "  - action: wiat_for"


def test_extract_rejects_two_blocks_and_an_unclosed_block() -> None:
    block = f"```durafix-repro\n{VALID}```\n"
    with pytest.raises(ProcedureError, match="more than one") as raised:
        extract_procedure(f"x\n{block}\n{block}")
    assert raised.value.line == 16
    with pytest.raises(ProcedureError, match="never closed"):
        extract_procedure(f"x\n```durafix-repro\n{VALID}")


def test_the_cart_issue_carries_the_cart_procedure() -> None:
    issue = (EXAMPLES / "ISSUE.md").read_text()
    title, _, body = issue.partition("\n")
    assert title.strip() and not title.startswith(("#", "`"))
    procedure = extract_procedure(body)
    assert isinstance(procedure, Procedure)
    assert procedure == parse_procedure((EXAMPLES / "repro.yaml").read_text())
    assert ExpectText(action="expect_text", selector="#total", not_equals="$40.00") in procedure.bug_present
