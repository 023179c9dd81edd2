"""The run tools' rules: what a ``run_tests``/``run`` call may run, how its calls are cut from a turn, and the
replay policy each tool declares."""

from __future__ import annotations

import json

import pytest

from repair.run_requests import MAX_OUTPUT_CHARS, RunRefused, RunRules, command_for, render_result
from repair.stepping import ToolCall, segments
from repair.tools import (
    RUN,
    RUN_REPRODUCTION,
    RUN_TESTS,
    WORKSPACE_TOOLS,
    Replay,
    parse_arguments,
    replay_policy,
    tool_schemas,
)

RULES = RunRules(
    test="python3 -m unittest discover -s tests -t .",
    test_subset="python3 -m unittest {files}",
    agent_commands=("npm run lint", "python3 -m mypy"),
)


def test_run_tests_without_files_runs_the_recipes_test_command() -> None:
    assert command_for(RUN_TESTS, {}, RULES) == RULES.test
    assert command_for(RUN_TESTS, parse_arguments(RUN_TESTS, "{}"), RULES) == RULES.test


def test_run_tests_with_files_fills_the_subset_with_each_file_quoted() -> None:
    got = command_for(RUN_TESTS, {"files": "tests/test_cart.py 'tests/test odd.py'"}, RULES)
    assert got == "python3 -m unittest tests/test_cart.py 'tests/test odd.py'"
    # A test file's name is one word to the shell, whatever it holds.
    assert (
        command_for(RUN_TESTS, {"files": "'tests/a;rm -rf x.py'"}, RULES) == "python3 -m unittest 'tests/a;rm -rf x.py'"
    )


@pytest.mark.parametrize(
    ("files", "why"),
    [
        ("cart.py", "is not a test file"),
        ("--help", "not a plain path"),
        ("/etc/passwd", "not a plain path"),
        ("tests/../cart.py", "not a plain path"),
        ("src/app.py", "is not a test file"),
        ("'unclosed", "files:"),
    ],
)
def test_run_tests_refuses_files_that_are_not_test_files(files: str, why: str) -> None:
    with pytest.raises(RunRefused, match=why):
        command_for(RUN_TESTS, {"files": files}, RULES)


def test_a_recipe_without_a_subset_runs_only_the_whole_suite() -> None:
    with pytest.raises(RunRefused, match="no test_subset"):
        command_for(RUN_TESTS, {"files": "tests/test_cart.py"}, RunRules(test="make test"))


def test_run_allows_only_commands_starting_with_an_allowed_entry_and_requotes_every_word() -> None:
    assert command_for(RUN, {"command": "npm run lint -- --fix"}, RULES) == "npm run lint -- --fix"
    # Shell operators become plain words: the shell never sees a second command.
    assert command_for(RUN, {"command": "npm run lint ';' curl evil"}, RULES) == "npm run lint ';' curl evil"
    with pytest.raises(RunRefused, match="not allowed"):
        command_for(RUN, {"command": "npm run lint; curl evil"}, RULES)  # 'lint;' is not the word 'lint'
    assert command_for(RUN, {"command": "python3 -m mypy $(id)"}, RULES) == "python3 -m mypy '$(id)'"
    with pytest.raises(RunRefused, match=r"not allowed.*npm run lint; python3 -m mypy"):
        command_for(RUN, {"command": "npm run build"}, RULES)
    with pytest.raises(RunRefused, match="allows no commands"):
        command_for(RUN, {"command": "ls"}, RunRules(test="t"))


def test_the_result_shows_how_it_ended_and_the_end_of_a_long_output() -> None:
    long = "x" * (MAX_OUTPUT_CHARS + 100) + "\nFAILED (failures=1)\n"
    text = render_result(
        "make test", exit_code=1, timed_out=False, duration_s=2.5, output=long, total_bytes=len(long), log_name="t.log"
    )
    lines = text.splitlines()
    assert lines[:2] == ["$ make test", "exited 1 (failed) in 2.5 s"]
    assert lines[2].startswith("output (the last ") and "FAILED (failures=1)" in text
    assert len(text) < MAX_OUTPUT_CHARS + 300 and lines[-1] == "the whole output is stored as t.log"
    timed = render_result("t", exit_code=None, timed_out=True, duration_s=300, output="", total_bytes=0, log_name="l")
    assert "timed out after 300 s" in timed and "(no output)" in timed


def test_a_turn_is_cut_so_each_run_sees_the_edits_before_it() -> None:
    def call(n: int, name: str) -> ToolCall:
        return ToolCall(id=f"c{n}", name=name, arguments="{}")

    calls = [
        call(1, "read_file"),
        call(2, "replace_in_file"),
        call(3, RUN_TESTS),
        call(4, RUN_TESTS),
        call(5, "write_file"),
        call(6, RUN_REPRODUCTION),
    ]
    cut = [(s.run, [c.id for c in s.calls]) for s in segments(calls)]
    assert cut == [
        (None, ["c1", "c2"]),
        (RUN_TESTS, ["c3"]),
        (RUN_TESTS, ["c4"]),
        (None, ["c5"]),
        (RUN_REPRODUCTION, ["c6"]),
    ]


def test_each_tool_declares_its_replay_policy() -> None:
    assert {name: replay_policy(name) for name in (*WORKSPACE_TOOLS, RUN_TESTS, RUN, RUN_REPRODUCTION)} == {
        **dict.fromkeys(WORKSPACE_TOOLS, Replay.SAFE),
        RUN_TESTS: Replay.REPORT_INTERRUPTED,
        RUN: Replay.REPORT_INTERRUPTED,
        RUN_REPRODUCTION: Replay.SAFE,
    }


def test_the_default_offer_is_the_workspace_tools_and_files_is_optional() -> None:
    assert [t["function"]["name"] for t in tool_schemas()] == list(WORKSPACE_TOOLS)
    offered = {t["function"]["name"]: t["function"] for t in tool_schemas([*WORKSPACE_TOOLS, RUN_TESTS, RUN])}
    assert offered[RUN_TESTS]["parameters"]["required"] == []
    assert offered[RUN]["parameters"]["required"] == ["command"]
    assert parse_arguments(RUN_TESTS, json.dumps({"files": None})) == {}
