"""Drafting a reproduction (browser, command or test) from a report's prose, against the scripted model server
over real HTTP."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any

import pytest

from browser.procedure import ExpectText, Procedure, Step, extract_procedure, parse_procedure
from browser.results import ReproductionStatus
from browser.runner import BrowserRunner
from environments.interface import AppRecipe
from environments.reproduction import (
    CommandProcedure,
    OutputCheck,
    ReproductionKind,
    TestProcedure,
    kind_of,
    parse_reproduction,
)
from repair.config import ModelConfig
from repair.interface import ModelPermanentError, ModelTransientError
from repair.procedure_draft import (
    EXAMPLE_COMMAND,
    EXAMPLE_PROCEDURE,
    EXAMPLE_TEST,
    MAX_FACT_PATHS,
    DraftResult,
    DraftRound,
    ProcedureDrafter,
    ProcedureDraftError,
    RepositoryFacts,
    available_kinds,
    conversation,
    recipe_kinds,
    repository_facts,
    schema_summary,
)
from tests.support.browser_apps import fixed_cart_copy, serve_cart
from tests.support.chromium import chromium_path
from tests.support.modelserver import Serve, inject_fault, recorded, tool_turn
from tests.support.repair import CART, CART_SCRIPTS

DRAFT = CART_SCRIPTS / "draft-procedure.yaml"
OP_ID = "repair:shop/cart#7:draft-procedure"
VALID = (
    "version: 1\nname: total\nsteps:\n  - {action: goto}\nbug_present:\n  - {action: expect_visible, selector: '#x'}\n"
)
UNKNOWN_ACTION = "version: 1\nname: total\nsteps:\n  - {action: teleport}\nbug_present:\n  - {action: goto}\n"


def cart_report_prose() -> tuple[str, str]:
    """The cart report's title and body with its durafix-repro block taken out, as a reporter might write it."""
    title, _, body = (CART / "ISSUE.md").read_text().partition("\n")
    prose = re.sub(r"```durafix-repro\n.*?```\n?", "", body, flags=re.DOTALL)
    assert extract_procedure(prose) is None
    return title, prose


def drafter_for(base_url: str, **options: Any) -> ProcedureDrafter:
    settings: dict[str, Any] = {"api_key": "test-key", "model": "durafix-scripted", "timeout_s": 10.0, **options}
    return ProcedureDrafter(base_url, **settings)


def script_of(*turns: dict[str, Any]) -> dict[str, Any]:
    return {"conversations": [{"name": "draft", "match": {"system": "durafix-task: draft-procedure"}, "turns": turns}]}


def submit(text: str) -> dict[str, Any]:
    return tool_turn("submit_procedure", yaml=text)


def tool_answers(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["body"]["messages"] if m["role"] == "tool"]


def test_invalid_submission_gets_its_error_back_and_the_corrected_one_is_kept(serve: Serve) -> None:
    server = serve(DRAFT)
    title, prose = cart_report_prose()
    config = ModelConfig(base_url=server.base_url, api_key="test-key", model="durafix-scripted", timeout_s=10)

    result = ProcedureDrafter.from_config(config).draft(title, prose, OP_ID)

    assert (result.rounds, result.model) == (2, "durafix-scripted")
    assert result.procedure == parse_procedure(result.procedure_yaml)
    assert DraftResult.model_validate_json(result.model_dump_json()) == result  # crosses activity boundaries as JSON
    assert [s.action for s in result.procedure.steps] == ["goto", "wait_for"]
    assert result.procedure.bug_present == [ExpectText(action="expect_text", selector="#total", not_equals="$40.00")]
    first, second = recorded(server)
    assert [r["headers"]["x-durafix-op-id"] for r in (first, second)] == [OP_ID, OP_ID]
    assert title in first["body"]["messages"][1]["content"]
    assert "durafix-repro" not in first["body"]["messages"][1]["content"]
    assert [t["function"]["name"] for t in first["body"]["tools"]] == ["submit_procedure"]
    (refusal,) = tool_answers(second)
    assert refusal.startswith("error: the reproduction is not valid: line 6: steps.1: ")
    assert "'check_total'" in refusal


def test_model_that_never_submits_a_valid_procedure_fails_after_max_rounds(serve: Serve) -> None:
    server = serve(script_of(*[submit(UNKNOWN_ACTION)] * 5))

    with pytest.raises(ProcedureDraftError, match="no valid reproduction in 3 rounds") as caught:
        drafter_for(server.base_url).draft("Cart total wrong", "The total is wrong.", OP_ID, max_rounds=3)

    assert caught.value.rounds == 3
    assert caught.value.last_error.startswith("the reproduction is not valid: line 4: steps.0: ")
    assert len(recorded(server)) == 3
    assert caught.value.prompt_tokens > 0 and caught.value.completion_tokens > 0


def test_answer_without_a_tool_call_costs_a_round_and_is_told_to_submit(serve: Serve) -> None:
    server = serve(script_of({"content": "The total looks wrong to me."}, submit(VALID)))

    result = drafter_for(server.base_url).draft("Cart total wrong", "The total is wrong.", OP_ID)

    assert result.rounds == 2
    told = recorded(server)[1]["body"]["messages"][-1]
    assert told["role"] == "user"
    assert told["content"] == "error: the answer made no tool call; call submit_procedure with the whole reproduction"


def test_other_tools_malformed_arguments_and_several_calls_are_each_refused_with_a_reason(serve: Serve) -> None:
    two_calls = {"tool_calls": [submit(VALID)["tool_calls"][0]] * 2}
    server = serve(
        script_of(
            tool_turn("open_browser", url="/"), tool_turn("submit_procedure", text=VALID), two_calls, submit(VALID)
        )
    )

    result = drafter_for(server.base_url).draft("Cart total wrong", "The total is wrong.", OP_ID, max_rounds=4)

    assert result.rounds == 4
    requests = recorded(server)
    assert tool_answers(requests[1]) == ["error: unknown tool 'open_browser'; the only tool is submit_procedure"]
    assert tool_answers(requests[2])[-1] == 'error: the arguments must be exactly {"yaml": "<the whole reproduction>"}'
    assert (
        tool_answers(requests[3])[-2:]
        == ["error: answer with exactly one submit_procedure call (this answer made 2)"] * 2
    )


def test_tokens_are_summed_over_every_round(serve: Serve) -> None:
    server = serve(script_of({"content": "one two three"}, {"content": "four", **submit(VALID)}))

    result = drafter_for(server.base_url).draft("Cart total wrong", "The total is wrong.", OP_ID)

    # The server counts one token per whitespace-separated word: the prompt's texts and tool-call arguments,
    # and the answer's text plus each call's name and JSON arguments.
    def words(message: dict[str, Any]) -> int:
        args = " ".join(c["function"]["arguments"] for c in message.get("tool_calls") or [])
        return len(f"{message.get('content') or ''} {args}".split())

    prompts = [sum(words(m) for m in r["body"]["messages"]) for r in recorded(server)]
    assert len(prompts) == 2
    assert result.prompt_tokens == sum(prompts)
    second_answer = f"four submit_procedure {json.dumps({'yaml': VALID})}"
    assert result.completion_tokens == 3 + len(second_answer.split())  # 3: "one two three"


def test_rate_limit_is_transient_and_carries_retry_after(serve: Serve) -> None:
    server = serve(DRAFT)
    inject_fault(server, status=429, retry_after=7)

    with pytest.raises(ModelTransientError) as caught:
        drafter_for(server.base_url).draft("Cart total wrong", "The total is wrong.", OP_ID)

    assert (caught.value.status, caught.value.retry_after) == (429, 7.0)
    assert len(recorded(server)) == 1  # the SDK did not retry on its own


def test_timeout_is_transient(serve: Serve) -> None:
    server = serve(DRAFT)
    inject_fault(server, delay_s=30)

    with pytest.raises(ModelTransientError, match=r"timed out after 0\.5s"):
        drafter_for(server.base_url, timeout_s=0.5).draft("Cart total wrong", "The total is wrong.", OP_ID)


def test_failure_in_a_later_round_carries_the_tokens_already_spent(serve: Serve) -> None:
    # The script holds one answer, so the second round is refused as past the conversation's end.
    server = serve(script_of(submit(UNKNOWN_ACTION)))

    with pytest.raises(ModelPermanentError, match="conversation 'draft' has 1 turns") as caught:
        drafter_for(server.base_url).draft("Cart total wrong", "The total is wrong.", OP_ID)

    first = recorded(server)[0]
    assert caught.value.status == 400
    assert caught.value.prompt_tokens == sum(len(str(m["content"]).split()) for m in first["body"]["messages"])
    assert caught.value.completion_tokens > 0


def test_wrong_api_key_is_permanent(serve: Serve, tmp_path: Path) -> None:
    script = tmp_path / "keyed.yaml"
    script.write_text(DRAFT.read_text() + "api_key: the-real-key\n")
    server = serve(script)

    with pytest.raises(ModelPermanentError) as caught:
        drafter_for(server.base_url, api_key="a-wrong-key").draft("Cart total wrong", "The total is wrong.", OP_ID)

    assert caught.value.status == 401


def test_schema_summary_names_every_step_shape_and_the_example_is_valid() -> None:
    shapes = typing.get_args(typing.get_args(Step)[0])
    tags = [typing.get_args(shape.model_fields["action"].annotation)[0] for shape in shapes]
    summary = schema_summary()

    assert all(f"- action: {tag};" in summary for tag in tags), summary
    assert parse_procedure(EXAMPLE_PROCEDURE).bug_present


@pytest.mark.slow
@pytest.mark.browser
def test_drafted_procedure_reproduces_the_cart_bug_and_not_on_a_fixed_copy(serve: Serve, tmp_path: Path) -> None:
    chromium = chromium_path()
    title, prose = cart_report_prose()
    drafted = drafter_for(serve(DRAFT).base_url).draft(title, prose, OP_ID).procedure
    assert isinstance(drafted, Procedure)

    with BrowserRunner(executable_path=chromium) as runner:
        with serve_cart() as buggy_url:
            buggy = runner.run(drafted, buggy_url, tmp_path / "buggy")
        with serve_cart(fixed_cart_copy(tmp_path / "fixed-app")) as fixed_url:
            fixed = runner.run(drafted, fixed_url, tmp_path / "fixed")

    assert buggy.status == ReproductionStatus.REPRODUCED, buggy.detail
    assert buggy.runs[0].assertions[0].actual == "$23.75"
    assert fixed.status == ReproductionStatus.NOT_REPRODUCED, fixed.detail
    assert fixed.runs[0].assertions[0].actual == "$40.00"


ALL_KINDS = (ReproductionKind.BROWSER, ReproductionKind.COMMAND, ReproductionKind.TEST)
FACTS = RepositoryFacts(
    ecosystem="python",
    test_command="python3 -m pytest",
    test_subset="python3 -m pytest {files}",
    top_level=["stats.py", "tests", "pyproject.toml"],
    test_files=["tests/test_stats.py"],
)
MEAN_REPORT = ("mean() is off by one", "mean([2, 4]) gives 2.0 instead of 3.0.")
COMMAND_DRAFT = """\
version: 1
kind: command
name: mean of [2, 4] is not 3
files:
  repro/show.py: |
    import sys
    sys.path.insert(0, ".")
    from stats import mean
    print(mean([2, 4]))
steps:
  - {run: python3 repro/show.py, timeout_s: 30}
bug_present:
  - {check: stdout, not_equals: "3.0"}
"""
TEST_DRAFT = """\
version: 1
kind: test
name: mean of [2, 4] is 3
files:
  tests/test_issue_24.py: |
    from stats import mean

    def test_mean_of_two():
        assert mean([2, 4]) == 3.0
tests:
  - tests/test_issue_24.py
"""


def test_a_command_reproduction_is_drafted_with_the_repository_facts_in_the_prompt(serve: Serve) -> None:
    server = serve(script_of(submit(COMMAND_DRAFT)))

    result = drafter_for(server.base_url).draft(*MEAN_REPORT, OP_ID, kinds=ALL_KINDS, facts=FACTS)

    assert (result.kind, result.rounds) == (ReproductionKind.COMMAND, 1)
    assert isinstance(result.procedure, CommandProcedure)
    assert result.procedure == parse_reproduction(result.procedure_yaml)
    assert DraftResult.model_validate_json(result.model_dump_json()) == result  # crosses activity boundaries as JSON
    (request,) = recorded(server)
    system = request["body"]["messages"][0]["content"]
    assert 'named tests run with: "python3 -m pytest {files}"' in system
    assert '"tests/test_stats.py"' in system
    assert "The kinds you may write here: browser, command, test." in system
    assert system.rstrip().endswith("durafix-task: draft-procedure")


def test_a_test_reproduction_is_drafted_and_names_the_file_it_writes(serve: Serve) -> None:
    server = serve(script_of(submit(TEST_DRAFT)))

    result = drafter_for(server.base_url).draft(*MEAN_REPORT, OP_ID, kinds=ALL_KINDS, facts=FACTS)

    assert isinstance(result.procedure, TestProcedure)
    assert result.kind == ReproductionKind.TEST
    assert list(result.procedure.files) == result.procedure.tests == ["tests/test_issue_24.py"]
    assert DraftResult.model_validate_json(result.model_dump_json()) == result


def test_a_test_that_names_none_of_the_files_it_writes_is_refused(serve: Serve) -> None:
    stray = TEST_DRAFT.replace("  - tests/test_issue_24.py\n", "  - tests/test_stats.py\n")
    server = serve(script_of(submit(stray), submit(TEST_DRAFT)))

    result = drafter_for(server.base_url).draft(*MEAN_REPORT, OP_ID, kinds=ALL_KINDS, facts=FACTS)

    assert result.rounds == 2
    (refusal,) = tool_answers(recorded(server)[1])
    assert refusal.startswith("error: the test reproduction writes files but its tests name none of them")


def test_kinds_the_recipe_cannot_run_are_refused_with_the_reason(serve: Serve) -> None:
    server = serve(script_of(submit(VALID), submit(TEST_DRAFT), submit(COMMAND_DRAFT)))
    no_app_no_subset = available_kinds(serves_app=False, runs_named_tests=False)

    result = drafter_for(server.base_url).draft(*MEAN_REPORT, OP_ID, kinds=no_app_no_subset)

    assert no_app_no_subset == (ReproductionKind.COMMAND,)
    assert (result.kind, result.rounds) == (ReproductionKind.COMMAND, 3)
    requests = recorded(server)
    assert tool_answers(requests[1]) == [
        "error: a browser reproduction cannot run here: the repository's recipe serves no app (it declares no "
        "start command), so there is no page to open; write one of: command"
    ]
    assert tool_answers(requests[2])[-1] == (
        "error: a test reproduction cannot run here: the repository's recipe declares no test_subset, so named "
        "tests cannot be run; write one of: command"
    )
    system = requests[0]["body"]["messages"][0]["content"]
    assert "- action: goto" not in system and "A test reproduction" not in system  # only what is offered
    assert "A command reproduction is a YAML mapping" in system


def test_a_command_against_the_app_is_refused_when_the_recipe_serves_none_and_taken_when_it_does(
    serve: Serve,
) -> None:
    against_app = COMMAND_DRAFT.replace("bug_present:", "app: true\nbug_present:")
    server = serve(script_of(submit(against_app), submit(COMMAND_DRAFT)))
    no_app = available_kinds(serves_app=False, runs_named_tests=False)

    result = drafter_for(server.base_url).draft(*MEAN_REPORT, OP_ID, kinds=no_app)

    assert isinstance(result.procedure, CommandProcedure) and not result.procedure.app and result.rounds == 2
    assert tool_answers(recorded(server)[1]) == [
        "error: a command reproduction with `app: true` cannot run here: the repository's recipe serves no app (it "
        "declares no start command); write commands that run without the app (leave `app` out)"
    ]

    served = serve(script_of(submit(against_app)))
    taken = drafter_for(served.base_url).draft(*MEAN_REPORT, OP_ID, kinds=ALL_KINDS)
    assert isinstance(taken.procedure, CommandProcedure) and taken.procedure.app and taken.rounds == 1


def test_a_round_refused_after_running_on_the_base_is_carried_into_the_next_call(serve: Serve) -> None:
    # Turn k answers the request holding k assistant messages: the earlier round is the first of them.
    server = serve(script_of(submit(COMMAND_DRAFT), submit(TEST_DRAFT)))
    refusal = (
        "ran on the base revision: not reproduced: bug absent in 1 of 1 runs: stdout not_equals '3.0' did not "
        "hold (actual '3.0')"
    )
    earlier = DraftRound(yaml=COMMAND_DRAFT, refusal=refusal)

    first = drafter_for(server.base_url).draft(*MEAN_REPORT, OP_ID, kinds=ALL_KINDS, facts=FACTS)
    second = drafter_for(server.base_url).draft(*MEAN_REPORT, OP_ID, kinds=ALL_KINDS, facts=FACTS, previous=[earlier])

    assert (first.kind, second.kind, second.rounds) == (ReproductionKind.COMMAND, ReproductionKind.TEST, 1)
    asked_first, asked_second = (r["body"]["messages"] for r in recorded(server))
    assert asked_second[:2] == asked_first  # the same system prompt and report, then the earlier round
    call, answer = asked_second[2:]
    assert call["role"] == "assistant"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in call["tool_calls"]] == [
        ("submit_procedure", {"yaml": COMMAND_DRAFT})
    ]
    assert answer == {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": f"error: {refusal}"}
    # Rebuilt from the inputs alone: the same inputs give the same messages.
    assert conversation(*MEAN_REPORT, kinds=ALL_KINDS, facts=FACTS, previous=[earlier]) == conversation(
        *MEAN_REPORT, kinds=list(reversed(ALL_KINDS)), facts=FACTS, previous=[earlier]
    )


def test_schema_summary_covers_command_and_test_fields_and_every_example_is_valid() -> None:
    summary = schema_summary()

    for model in (CommandProcedure, TestProcedure):
        fields = [f for f in model.model_fields if f != "app"]
        assert all(f"  {f}: " in summary for f in fields), (model.__name__, summary)
    assert all(f"{f}: " in summary for f in OutputCheck.model_fields)
    for example, kind in ((EXAMPLE_PROCEDURE, "browser"), (EXAMPLE_COMMAND, "command"), (EXAMPLE_TEST, "test")):
        assert kind_of(parse_reproduction(example)) == kind


def test_the_facts_and_kinds_of_a_recipe_and_its_tracked_files() -> None:
    recipe = AppRecipe(start="python3 app.py", test="python3 -m pytest", test_subset="python3 -m pytest {files}")
    paths = ["stats.py", "pyproject.toml", "tests/test_stats.py", "tests/__init__.py", "docs/index.md"]

    facts = repository_facts(recipe, paths)

    assert facts == RepositoryFacts(
        ecosystem="python",
        test_command="python3 -m pytest",
        test_subset="python3 -m pytest {files}",
        top_level=["docs/", "pyproject.toml", "stats.py", "tests/"],
        test_files=["tests/__init__.py", "tests/test_stats.py"],
    )
    assert recipe_kinds(recipe) == ALL_KINDS
    assert recipe_kinds(recipe.model_copy(update={"test_subset": None})) == ALL_KINDS[:2]
    many = RepositoryFacts(top_level=[f"f{n}.py" for n in range(MAX_FACT_PATHS + 5)]).render()
    assert many.endswith('"f59.py" and 5 more')
