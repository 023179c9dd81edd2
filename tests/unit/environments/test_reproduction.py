"""The durafix-repro block's kinds: one closed schema and parser, hostile paths and patterns refused, stored
forms read back, a browser procedure stored exactly as before kinds existed."""

from __future__ import annotations

import pytest

from browser.procedure import Procedure, ProcedureError, procedure_digest
from environments.reproduction import (
    CommandProcedure,
    ReproductionKind,
    TestProcedure,
    extract_reproduction,
    kind_of,
    load_reproduction,
    parse_reproduction,
    stored_form,
    to_yaml,
)

BROWSER = """version: 1
name: total
steps:
  - {action: goto, path: /}
bug_present:
  - {action: expect_text, selector: "#total", equals: "$13.50"}
"""
COMMAND = """version: 1
kind: command
name: mean is wrong
files: {repro.py: "print(1)"}
steps:
  - {run: python3 repro.py, timeout_s: 30}
bug_present:
  - {check: stdout, not_equals: "3.0"}
  - {check: file, path: out/result.txt, matches: "^1$"}
runs: 2
"""
TEST = """version: 1
kind: test
name: mean of two
files:
  tests/test_issue_7.py: "def test_it():\\n    assert False\\n"
tests: [tests/test_issue_7.py]
"""


def refusal(text: str) -> str:
    with pytest.raises(ProcedureError) as caught:
        parse_reproduction(text)
    return str(caught.value)


def test_each_kind_parses_to_its_model_and_a_browser_procedure_keeps_its_stored_form() -> None:
    browser = parse_reproduction(BROWSER)
    assert isinstance(browser, Procedure) and kind_of(browser) == ReproductionKind.BROWSER
    explicit = parse_reproduction(BROWSER.replace("name: total", "kind: browser\nname: total"))
    assert explicit == browser and procedure_digest(explicit) == procedure_digest(browser)
    assert b'"kind"' not in stored_form(browser)
    assert stored_form(browser) == browser.model_dump_json(indent=2).encode()

    command = parse_reproduction(COMMAND)
    assert isinstance(command, CommandProcedure) and command.runs == 2
    assert command.bug_present[1].describe() == "file out/result.txt matches '^1$'"
    test = parse_reproduction(TEST)
    assert isinstance(test, TestProcedure) and test.tests == ["tests/test_issue_7.py"]
    for each in (browser, command, test):
        assert load_reproduction(stored_form(each)) == each
        assert parse_reproduction(to_yaml(each)) == each


def test_the_block_is_found_in_a_report_and_its_errors_carry_the_report_line() -> None:
    body = f"It breaks.\n\n```durafix-repro\n{COMMAND}```\n"
    assert isinstance(extract_reproduction(body), CommandProcedure)
    broken = body.replace("check: stdout", "check: stdin")
    with pytest.raises(ProcedureError) as caught:
        extract_reproduction(broken)
    assert caught.value.line == 11
    assert extract_reproduction("no block here") is None


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/etc/passwd", "relative"),
        ("../outside.py", "plain"),
        ("a/./b.py", "plain"),
        (".git/hooks/pre-commit", "under .git"),
        ("sub/.git/config", "under .git"),
        (".durafix-repro/run-1/1.out", "under .git or .durafix-repro"),
        ("a\\b.py", "relative"),
    ],
)
def test_a_file_path_that_could_leave_the_workspace_or_touch_git_is_refused(path: str, said: str) -> None:
    text = COMMAND.replace("{repro.py:", "{" + f'"{path}":'.replace("\\", "\\\\"))
    assert said in refusal(text)


def test_the_schema_is_closed_and_capped() -> None:
    assert "Extra inputs" in refusal(COMMAND.replace("runs: 2", "runs: 2\nshell: bash"))
    assert "kind: must be one of" in refusal(COMMAND.replace("kind: command", "kind: shell"))
    assert "exactly one of" in refusal(COMMAND.replace('not_equals: "3.0"', 'not_equals: "3.0", contains: x'))
    assert "`path` is given" in refusal(COMMAND.replace("check: stdout,", "check: stdout, path: x,"))
    assert "uses a backreference" in refusal(COMMAND.replace('"^1$"', '"(a)\\\\1"'))
    assert "at most 32000 characters" in refusal(COMMAND.replace("print(1)", "x" * 33_000))
    assert "option" in refusal(TEST.replace("[tests/test_issue_7.py]", "[--collect-only]"))
    assert "timeout_s" in refusal(COMMAND.replace("timeout_s: 30", "timeout_s: 100000"))


def test_a_command_reproduction_may_ask_for_the_app_and_keeps_it_through_storage() -> None:
    plain = parse_reproduction(COMMAND)
    assert isinstance(plain, CommandProcedure) and plain.app is False
    with_app = parse_reproduction(COMMAND.replace("runs: 2", "runs: 2\napp: true"))
    assert isinstance(with_app, CommandProcedure) and with_app.app is True
    assert b'"app": true' in stored_form(with_app)
    assert load_reproduction(stored_form(with_app)) == with_app
    assert "app: true" in to_yaml(with_app) and "app:" not in to_yaml(plain)
    assert "valid boolean" in refusal(COMMAND.replace("runs: 2", "runs: 2\napp: sometimes"))
    # Only a command reproduction runs its own commands against the app; the other kinds have no such key.
    assert "Extra inputs" in refusal(TEST + "app: true\n")
