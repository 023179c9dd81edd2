"""What a stepped attempt's steps put into workflow history stays small whatever the model writes: a turn that
writes a 1 MB file returns, and hands to its tool step, a few hundred bytes; the file reaches the workspace
from the stored transcript; a later turn's input does not carry the report again; a summary is cut. Driven
on real git, the scripted model server and the local evidence store, sized as Temporal's payload converter
encodes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from environments.workspace import WorkspaceManager
from evidence.interface import ArtifactKind, ArtifactRef
from evidence.local import LocalArtifactStore
from pipeline.activities.agent import AgentActivities
from pipeline.activities.agent_calls import REF_PREFIX
from pipeline.state import ReproductionFact, ReproductionOutcome
from pipeline.steps import AgentToolCall, AgentTurnInput
from repair.context import EarlierAttempt
from repair.stepping import MAX_SUMMARY_CHARS, arguments_digest, decode_transcript, encode_transcript
from reviews.git_credentials import NO_GIT_CREDENTIALS
from tests.support import agent_steps
from tests.support.agent_steps import activities, tools_input, turn_input
from tests.support.gitrepo import Repo
from tests.support.modelserver import Serve, recorded, tool_turn

RUN = "repair:shop/cart#23"
TITLE = "Cart total ignores quantities"
MEGABYTE = 1024 * 1024


def history_bytes(value: BaseModel) -> int:
    """The size of ``value`` as it is recorded in workflow history (the payload the run's converter makes)."""
    (payload,) = pydantic_data_converter.payload_converter.to_payloads([value])
    return payload.ByteSize()


def spec_of(store: LocalArtifactStore, repo: Repo) -> ArtifactRef:
    return agent_steps.spec_of(store, repo, RUN)


def script(*turns: dict[str, Any]) -> dict[str, Any]:
    return {"model": "durafix-scripted", "conversations": [{"name": "payloads", "turns": list(turns)}]}


def first_turn(**facts: Any) -> AgentTurnInput:
    return turn_input(RUN, 1, TITLE, 10**7, **facts)


def test_a_turn_that_writes_a_megabyte_file_records_a_reference_and_the_file_reaches_the_workspace(
    tmp_path: Path, repo: Repo, serve: Serve
) -> None:
    content = "".join(f"line {i:07d} of a large generated fixture\n" for i in range(MEGABYTE // 40))
    assert len(content) >= MEGABYTE
    server = serve(script(tool_turn("write_file", path="big.txt", content=content)))
    agent, store = activities(tmp_path, server.base_url)
    spec_ref = spec_of(store, repo)
    env = ActivityEnvironment()

    answer = env.run(agent.agent_turn, first_turn(issue_body="The total is wrong."))
    tools = tools_input(RUN, 1, spec_ref, answer.transcript_ref, answer.calls)
    ran = env.run(agent.agent_tools, tools)

    # History holds the call by reference: the turn's result and the tool step's input are each under 2 kB.
    (call,) = answer.calls
    assert call.name == "write_file" and call.arguments.startswith(REF_PREFIX)
    assert content[:1000] not in call.arguments
    assert history_bytes(answer) < 2_000 and history_bytes(tools) < 2_000 and history_bytes(ran) < 2_000
    # The stored transcript holds the arguments the reference names, and they reached the workspace.
    asked = decode_transcript(store.read_bytes(answer.transcript_ref))[-1]["tool_calls"][0]["function"]["arguments"]
    assert call.arguments == f"{REF_PREFIX}{arguments_digest(asked)}:{len(asked)}"
    assert ran.files_changed == ["big.txt"] and ran.patch_ref is not None
    assert ran.patch_ref.size > MEGABYTE
    assert "+line 0026213 of a large generated fixture" in store.read_bytes(ran.patch_ref).decode()


def test_calls_sharing_an_id_are_told_apart_by_their_arguments_and_a_foreign_reference_runs_nothing(
    tmp_path: Path, repo: Repo
) -> None:
    store = LocalArtifactStore(tmp_path / "evidence")
    workspaces = WorkspaceManager(cache_dir=tmp_path / "cache", root=tmp_path / "workspaces")
    agent = AgentActivities(store, workspaces, lambda: pytest.fail("no model is asked"), git_token=NO_GIT_CREDENTIALS)
    spec_ref = spec_of(store, repo)
    # A model's answer may reuse a call ID; each call is carried out with its own arguments.
    one, two = '{"path": "a.txt", "content": "one\\n"}', '{"path": "b.txt", "content": "two\\n"}'
    answer = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "dup", "type": "function", "function": {"name": "write_file", "arguments": args}}
            for args in (one, two)
        ],
    }
    transcript = store.put_bytes(encode_transcript([answer]), kind=ArtifactKind.OTHER, run_id=RUN, name="t.json")
    refs = [
        AgentToolCall(id="dup", name="write_file", arguments=f"{REF_PREFIX}{arguments_digest(a)}:{len(a)}")
        for a in (two, one)
    ]
    tools = tools_input(RUN, 1, spec_ref, transcript, refs)
    env = ActivityEnvironment()
    ran = env.run(agent.agent_tools, tools)
    assert sorted(ran.files_changed) == ["a.txt", "b.txt"] and ran.patch_ref is not None
    patch = store.read_bytes(ran.patch_ref).decode()
    assert "+one" in patch and "+two" in patch

    # A reference the transcript's last answer does not hold (another turn's, or forged): nothing is carried
    # out and the step fails for good, rather than running the call with other arguments.
    other = '{"path": "c.txt", "content": "three\\n"}'
    forged = AgentToolCall(id="dup", name="write_file", arguments=f"{REF_PREFIX}{arguments_digest(other)}:{len(other)}")
    with pytest.raises(ApplicationError) as refused:
        env.run(agent.agent_tools, tools.model_copy(update={"calls": [forged]}))
    assert refused.value.non_retryable and "holds no write_file call 'dup'" in refused.value.message
    assert not any((tmp_path / "workspaces").rglob("c.txt"))

    # A call recorded before references (its arguments inline) is still carried out as it was.
    inline = env.run(
        agent.agent_tools,
        tools.model_copy(update={"calls": [AgentToolCall(id="old", name="write_file", arguments=other)]}),
    )
    assert inline.files_changed == ["c.txt"]


def test_the_opening_facts_travel_with_the_first_turn_only_and_later_turns_still_show_them_to_the_model(
    tmp_path: Path, repo: Repo, serve: Serve
) -> None:
    body = "Steps to reproduce the wrong total, at length. " * 1_500
    server = serve(script(tool_turn("read_file", path="cart.py"), {"content": "Nothing to change."}))
    agent, store = activities(tmp_path, server.base_url)
    spec_ref = spec_of(store, repo)
    facts: dict[str, Any] = {
        "issue_body": body,
        "previous_failures": ["attempt 1: the tests failed"],
        "spec_ref": spec_ref,
        "baseline_summary": "12 passed",
        "earlier_attempts": [EarlierAttempt(attempt=1, summary="changed nothing", reason="tests failed")],
        "reproduction": ReproductionFact(
            op_id="r", revision=repo.base, status=ReproductionOutcome.REPRODUCED, procedure_ref=spec_ref
        ),
    }
    opening = first_turn(**facts)
    assert opening.issue_body == body and history_bytes(opening) > len(body)
    env = ActivityEnvironment()
    answer = env.run(agent.agent_turn, opening)
    ran = env.run(agent.agent_tools, tools_input(RUN, 1, spec_ref, answer.transcript_ref, answer.calls))
    # The second turn's input is built as the first was, every fact passed again; it carries none of them.
    later = turn_input(RUN, 2, TITLE, 10**7, transcript_ref=ran.transcript_ref, **facts)
    assert (later.issue_title, later.issue_body, later.previous_failures, later.earlier_attempts) == ("", "", [], [])
    assert (later.spec_ref, later.reproduction, later.baseline_summary) == (None, None, None)
    assert history_bytes(later) < 1_500
    done = env.run(agent.agent_turn, later)
    assert done.summary == "Nothing to change."
    # The model still read the report on the second turn: it is in the stored transcript the turn sent.
    second = recorded(server)[-1]["body"]["messages"]
    assert TITLE in second[1]["content"] and body[:200] in second[1]["content"]


def test_a_summary_is_cut_for_history_and_kept_whole_in_the_transcript(
    tmp_path: Path, repo: Repo, serve: Serve
) -> None:
    summary = "The cause, explained once more. " * 10_000
    server = serve(script(tool_turn("finish", summary=summary)))
    agent, store = activities(tmp_path, server.base_url)
    spec_ref = spec_of(store, repo)
    env = ActivityEnvironment()
    answer = env.run(agent.agent_turn, first_turn(issue_body="The total is wrong."))
    ran = env.run(agent.agent_tools, tools_input(RUN, 1, spec_ref, answer.transcript_ref, answer.calls))
    assert ran.summary is not None and ran.summary.startswith(summary[:MAX_SUMMARY_CHARS])
    assert len(ran.summary) < MAX_SUMMARY_CHARS + 100 and "more characters of the summary" in ran.summary
    assert history_bytes(ran) < MAX_SUMMARY_CHARS + 1_000
    stored = decode_transcript(store.read_bytes(ran.transcript_ref))
    assert summary.strip() in stored[-2]["tool_calls"][0]["function"]["arguments"].replace("\\n", "\n")
