"""The stepped attempt's activities, driven step by step as the workflow drives them, on real git and the
scripted model server: they propose exactly what the in-memory engine proposes, a tool batch run again on
its recorded pre-state gives the same transcript and patch, and the end refuses an attempt that changed
nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from evidence.interface import ArtifactKind, ArtifactRef
from evidence.local import LocalArtifactStore
from infra.modelserver.server import ScriptedModelServer
from pipeline.activities.agent import AgentActivities
from pipeline.steps import (
    AGENT_MAX_TURNS,
    AgentToolsResult,
    ProposalResult,
)
from repair.compaction import COMPACTED_MARKER
from repair.stepping import ToolCall, decode_transcript, encode_transcript, made_edits, tool_batch
from repair.workspace_tools import WorkspaceTools
from tests.support import agent_steps
from tests.support.agent_steps import activities, conclude_input, tools_input, turn_input
from tests.support.gitrepo import Repo
from tests.support.modelserver import Serve, recorded
from tests.support.repair import CART_SCRIPTS, engine_for, request_for

RUN = "repair:shop/cart#7"
TITLE = "Cart total ignores quantities"
BODY = "The cart page shows Total: $23.75 but the lines add up to $40.00."


def drive(
    agent: AgentActivities, spec_ref: ArtifactRef, *, rerun_tools: bool = False, compact_above: int | None = None
) -> ProposalResult:
    """The workflow's loop: turn, tools, turn, ..., conclusion; each tool batch run twice when ``rerun_tools``
    (a retry after the first run's result was lost), checking the second gives the same result; the
    transcript compacted above ``compact_above`` characters."""
    env = ActivityEnvironment()
    transcript: ArtifactRef | None = None
    patch: ArtifactRef | None = None
    prompt = completion = 0
    summary: str | None = None
    model = ""
    for turn in range(1, AGENT_MAX_TURNS + 1):
        answer = env.run(
            agent.agent_turn,
            turn_input(
                RUN,
                turn,
                TITLE,
                100_000 - prompt - completion,
                issue_body=BODY,
                transcript_ref=transcript,
                patch_ref=patch,
                compact_above_chars=compact_above,
            ),
        )
        prompt, completion, model = prompt + answer.prompt_tokens, completion + answer.completion_tokens, answer.model
        transcript = answer.transcript_ref
        if not answer.calls:
            summary = answer.summary
            break
        tools = tools_input(RUN, turn, spec_ref, transcript, answer.calls, patch)
        ran: AgentToolsResult = env.run(agent.agent_tools, tools)
        if rerun_tools:
            assert env.run(agent.agent_tools, tools) == ran
        transcript, patch, summary = ran.transcript_ref, ran.patch_ref, ran.summary
        if summary is not None:
            break
    assert summary is not None
    return env.run(
        agent.agent_conclude,
        conclude_input(
            RUN,
            spec_ref,
            summary,
            patch_ref=patch,
            transcript_ref=transcript,
            prompt_tokens=prompt,
            completion_tokens=completion,
            model=model,
        ),
    )


def spec_of(store: LocalArtifactStore, repo: Repo) -> ArtifactRef:
    return agent_steps.spec_of(store, repo, RUN)


class Fixing(NamedTuple):
    """The model server answering with the cart's fix script, agent activities asking it, their store, and the
    cart's recovery spec stored there."""

    server: ScriptedModelServer
    agent: AgentActivities
    store: LocalArtifactStore
    spec_ref: ArtifactRef


@pytest.fixture
def fixing(tmp_path: Path, repo: Repo, serve: Serve) -> Fixing:
    server = serve(CART_SCRIPTS / "fix.yaml")
    agent, store = activities(tmp_path, server.base_url)
    return Fixing(server, agent, store, spec_of(store, repo))


def test_the_stepped_attempt_proposes_what_the_engine_proposes_and_a_rerun_tool_batch_changes_nothing(
    fixing: Fixing, cart_repo: Path
) -> None:
    server, agent, store, spec_ref = fixing

    stepped = drive(agent, spec_ref, rerun_tools=True)
    in_memory = engine_for(server.base_url).propose(request_for(cart_repo, issue_title=TITLE, issue_body=BODY))

    assert store.read_bytes(stepped.patch_ref).decode() == in_memory.patch
    assert stepped.patch_ref.kind == ArtifactKind.PATCH and stepped.patch_ref.name == "attempt-1.patch"
    assert stepped.summary == in_memory.summary and stepped.files_changed == in_memory.files_changed
    assert (stepped.prompt_tokens, stepped.completion_tokens) == (in_memory.prompt_tokens, in_memory.completion_tokens)
    # Both conversations sent the same six requests; none went twice.
    bodies = [r["body"]["messages"] for r in recorded(server)]
    assert len(bodies) == 12 and bodies[:6] == bodies[6:]


def test_a_long_transcript_is_compacted_from_durable_facts_and_the_attempt_proposes_the_same_patch(
    fixing: Fixing,
) -> None:
    server, agent, store, spec_ref = fixing
    whole = drive(agent, spec_ref)
    compacted = drive(agent, spec_ref, compact_above=2_500)

    assert store.read_bytes(compacted.patch_ref) == store.read_bytes(whole.patch_ref)
    sent = [r["body"]["messages"] for r in recorded(server)]
    plain, short = sent[:6], sent[6:]
    assert len(short) == 6
    squeezed = [m for m in short if any(COMPACTED_MARKER in str(x.get("content")) for x in m)]
    assert squeezed, "no request was compacted"
    for request, original in zip(short, plain, strict=True):
        assert request[:2] == original[:2]  # the system prompt and the report are never compacted
        if request in squeezed:
            facts = request[2]["content"]
            assert request[2]["role"] == "user" and len(json.dumps(request)) < len(json.dumps(original))
            # The patch so far is stated whole, from the stored patch, and what the dropped turns looked at.
            assert "Looked at: read_file cart.py" in facts
            assert "+    return sum(line_total(item) for item in items)" in facts or "no change" in facts
            assert request[3]["role"] == "assistant"  # the kept tail starts at a turn, tool results follow it


def test_the_transcript_is_stored_by_content_after_every_step(tmp_path: Path, fixing: Fixing) -> None:
    _, agent, store, spec_ref = fixing
    env = ActivityEnvironment()
    beats: list[object] = []
    env.on_heartbeat = lambda *details: beats.extend(details)
    first = env.run(agent.agent_turn, turn_input(RUN, 1, TITLE, 100_000, issue_body=BODY))
    messages = decode_transcript(store.read_bytes(first.transcript_ref))
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert "durafix-attempt: 1" in messages[0]["content"] and TITLE in messages[1]["content"]
    assert [c.name for c in first.calls] == ["search"] and first.summary is None
    assert any("asking the model (attempt 1, turn 1)" in str(b) for b in beats)

    ran = env.run(agent.agent_tools, tools_input(RUN, 1, spec_ref, first.transcript_ref, first.calls))
    after = decode_transcript(store.read_bytes(ran.transcript_ref))
    assert after[:3] == messages and after[3]["role"] == "tool" and after[3]["tool_call_id"] == first.calls[0].id
    assert "cart.py" in after[3]["content"]
    assert ran.patch_ref is None and ran.summary is None  # a search changes nothing
    # The workspace of a step is gone once the step is done.
    assert not any((tmp_path / "workspaces").rglob("cart.py"))


def test_an_attempt_that_changed_nothing_or_whose_patch_is_refused_ends_as_no_patch(fixing: Fixing) -> None:
    _, agent, store, spec_ref = fixing
    env = ActivityEnvironment()
    conclude = conclude_input(RUN, spec_ref, "nothing to do", prompt_tokens=10, completion_tokens=5, model="m")
    with pytest.raises(ApplicationError) as nothing:
        env.run(agent.agent_conclude, conclude)
    assert nothing.value.type == "NoPatch" and nothing.value.non_retryable
    assert "without changing anything: nothing to do" in nothing.value.message
    # The workflow charged every turn already: the failure carries no tokens of its own. It never edited: a refusal.
    assert nothing.value.details == (
        {"prompt_tokens": 0, "completion_tokens": 0, "transport_failures": 0},
        {"no_patch": "refused"},
    )

    # Edits that cancel out (an edit the workspace carried out, yet no patch): a no-op patch.
    edited: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "write_file", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "write_file", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "wrote cart.py"},
        {"role": "tool", "tool_call_id": "c2", "content": "wrote cart.py"},
    ]
    transcript = store.put_bytes(encode_transcript(edited), kind=ArtifactKind.OTHER, run_id=RUN, name="t.json")
    with pytest.raises(ApplicationError) as no_op:
        env.run(agent.agent_conclude, conclude.model_copy(update={"transcript_ref": transcript}))
    assert no_op.value.type == "NoPatch" and "its edits leave the code unchanged" in no_op.value.message
    assert no_op.value.details[1] == {"no_patch": "no-op"}

    # A patch the default policy refuses (it adds a CI workflow).
    ci = (
        "diff --git a/.github/workflows/ci.yml b/.github/workflows/ci.yml\n"
        "new file mode 100644\n"
        "--- /dev/null\n"
        "+++ b/.github/workflows/ci.yml\n"
        "@@ -0,0 +1 @@\n"
        "+on: push\n"
    )
    patch_ref = store.put_bytes(ci.encode(), kind=ArtifactKind.PATCH, run_id=RUN, name="ci.patch")
    with pytest.raises(ApplicationError) as refused:
        env.run(agent.agent_conclude, conclude.model_copy(update={"patch_ref": patch_ref}))
    assert refused.value.type == "NoPatch" and "the proposed patch was refused" in refused.value.message
    assert refused.value.details[1] == {"no_patch": "refused"}


def test_a_tool_batch_counts_the_calls_it_answered_with_an_error_and_only_carried_out_edits_count(
    tmp_path: Path,
) -> None:
    (tmp_path / "cart.py").write_text("total = 0\n")
    calls = [
        ToolCall(id="c1", name="read_file", arguments='{"path": "cart.py"}'),
        ToolCall(id="c2", name="delete_everything", arguments="{}"),
        ToolCall(id="c3", name="replace_in_file", arguments='{"path": "cart.py", "old": "absent", "new": "x"}'),
        ToolCall(id="c4", name="write_file", arguments="not json"),
    ]
    batch = tool_batch(WorkspaceTools(tmp_path), calls)

    assert [m["content"].startswith("error: ") for m in batch.messages] == [False, True, True, True]
    assert batch.invalid_calls == 3
    asked = {"role": "assistant", "tool_calls": [{"id": c.id, "function": {"name": c.name}} for c in calls]}
    # Both edits were refused: the transcript holds no edit, so an attempt ending here declined to change anything.
    assert not made_edits([asked, *batch.messages])
    fixed = tool_batch(
        WorkspaceTools(tmp_path),
        [ToolCall(id="c5", name="replace_in_file", arguments='{"path": "cart.py", "old": "0", "new": "1"}')],
    )
    assert fixed.invalid_calls == 0
    edit = {"role": "assistant", "tool_calls": [{"id": "c5", "function": {"name": "replace_in_file"}}]}
    assert made_edits([asked, *batch.messages, edit, *fixed.messages])
