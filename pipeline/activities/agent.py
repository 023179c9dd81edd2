"""The stepped repair attempt's activities (model queue): one model turn, one batch of tool calls, the end.

The workflow drives the attempt (``RepairBugWorkflow._stepped_attempt``); the attempt's state is the
transcript, stored by content in the evidence store after every step, and the patch so far against the
base revision, stored the same way. Each completed step is in the workflow history with the references it
returned, so it never runs again; what a retry re-does is only the step in flight:

- ``model.agent_turn`` sends the stored transcript once (:func:`repair.stepping.model_turn`) and stores it
  with the answer appended; a transcript longer than the run policy's ``agent_compact_chars`` is first
  compacted from durable facts (:mod:`repair.compaction`), deterministically, and stored compacted. Not
  idempotent at the model: a retry re-sends that one request (it was in flight or failed), never an earlier
  one. The tokens of its tries ride in the heartbeat details as for every model activity
  (:mod:`pipeline.activities.spend`). The first turn builds the opening messages from the report and the
  run's facts the workflow passed (:mod:`pipeline.activities.repair_facts`).
- ``model.agent_tools`` rebuilds a scratch workspace from the mirror at base + the patch so far, carries out
  the turn's calls (:func:`repair.stepping.tool_batch`), takes the new patch against the base revision, and
  stores transcript and patch. Replay-safe by construction: every tool reads or edits the workspace, and a
  retry starts again from the same pre-state, so it gives the same messages and the same patch.
- ``model.agent_record`` appends the results of calls the workflow carried out itself (``run_reproduction``)
  to the transcript. Idempotent. (``run_tests`` and ``run`` are carried out on the environments queue, in the
  sandbox: :mod:`pipeline.activities.agent_runs`.)
- ``model.agent_conclude`` judges the final patch against the mirror with the operator's patch policy, as
  ``model.propose_patch`` does, and stores it as the attempt's proposal. Idempotent (content-addressed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from temporalio import activity

from environments.run_fence import ensure_not_fenced
from environments.workspace import WorkspaceManager
from evidence.interface import ArtifactKind, ArtifactRef, ArtifactStore
from pipeline import steps
from pipeline.activities.agent_calls import call_ref, carried_call
from pipeline.activities.classify import classified
from pipeline.activities.environments import put_patch
from pipeline.activities.heartbeat import Heartbeat
from pipeline.activities.repair_facts import repair_context
from pipeline.activities.spend import Spend, budgeted, failing
from pipeline.activities.workspace import PatchingActivities, open_spec, rebuild
from pipeline.failures import NO_OP, NO_PATCH_KIND, REFUSED, FailureClass
from pipeline.steps import (
    AgentConcludeInput,
    AgentRecordInput,
    AgentToolsInput,
    AgentToolsResult,
    AgentTurnInput,
    AgentTurnResult,
    ProposalResult,
    ProposePatchInput,
)
from repair.compaction import compact
from repair.interface import NoPatchError, RepairError, RepairRequest
from repair.openai_calls import ChatEndpoint
from repair.patch import PatchCheck, workspace_patch
from repair.patch_policy import PatchPolicy
from repair.stepping import (
    decode_transcript,
    encode_transcript,
    made_edits,
    model_turn,
    opening_messages,
    tool_batch,
    tool_message,
)
from repair.workspace_tools import WorkspaceTools
from reviews.git_credentials import GitCredentials


class AgentActivities(PatchingActivities):
    def __init__(
        self,
        store: ArtifactStore,
        workspaces: WorkspaceManager,
        endpoint: Callable[[], ChatEndpoint],
        git_token: GitCredentials,
        patch_policies: Mapping[str, PatchPolicy] | None = None,
    ) -> None:
        """``endpoint`` is made on first use, so a host only builds the client when a turn runs."""
        super().__init__(store, workspaces, git_token, patch_policies)
        self.endpoint = endpoint

    def all(self) -> Sequence[Callable[..., object]]:
        return [self.agent_turn, self.agent_tools, self.agent_record, self.agent_conclude]

    @activity.defn(name=steps.AGENT_TURN.name)
    def agent_turn(self, inp: AgentTurnInput) -> AgentTurnResult:
        """One model request on the stored transcript; see the module docstring for what a retry re-sends."""
        with classified():
            ensure_not_fenced(self.store, inp.run_id, f"to ask the model for {inp.op_id}")
        earlier, beat = budgeted(f"asking the model (attempt {inp.attempt}, turn {inp.turn})", inp.token_budget, "turn")
        if inp.transcript_ref is None:
            # The opening messages state the attempt's whole budget, not what this step's earlier tries left:
            # a retried first turn builds the same messages.
            messages = opening_messages(
                attempt_request(inp, None, Spend()), repair_context(self.store, inp, self.git_token), tools=inp.tools
            )
        else:
            messages = decode_transcript(self.store.read_bytes(inp.transcript_ref))
            if inp.compact_above_chars is not None:
                patch = self.store.read_bytes(inp.patch_ref).decode() if inp.patch_ref is not None else None
                messages = compact(messages, patch=patch, above_chars=inp.compact_above_chars) or messages
        try:
            with beat:
                turn = model_turn(
                    self.endpoint(),
                    messages,
                    op_id=inp.op_id,
                    token_budget=inp.token_budget - earlier.total,
                    tools=inp.tools,
                )
        except RepairError as err:
            raise failing(err, earlier.plus(err.prompt_tokens, err.completion_tokens), beat) from err
        spent = earlier.plus(turn.prompt_tokens, turn.completion_tokens)
        return AgentTurnResult(
            transcript_ref=self._put_transcript(inp.run_id, inp.attempt, f"turn-{inp.turn}", turn.messages),
            calls=[call_ref(c) for c in turn.calls],
            summary=turn.summary,
            prompt_tokens=spent.prompt_tokens,
            completion_tokens=spent.completion_tokens,
            model=turn.model,
            transport_retries=earlier.transport_failures,
        )

    @activity.defn(name=steps.AGENT_TOOLS.name)
    def agent_tools(self, inp: AgentToolsInput) -> AgentToolsResult:
        """The turn's calls on base + the patch so far; replay-safe (see the module docstring)."""
        spec = open_spec(self.store, inp.spec_ref, inp.run_id, f"to rebuild a workspace for {inp.op_id}")
        names = ", ".join(c.name for c in inp.calls)
        beat = Heartbeat(f"running {len(inp.calls)} tool call(s) (attempt {inp.attempt}, turn {inp.turn}): {names}")
        patch = self.store.read_bytes(inp.patch_ref).decode() if inp.patch_ref is not None else None
        messages = decode_transcript(self.store.read_bytes(inp.transcript_ref))
        with classified():
            calls = [carried_call(messages, c) for c in inp.calls]
        with beat, classified():
            ws = rebuild(
                self.workspaces, self.git_token, inp.run_id, inp.op_id, spec.clone_url, spec.base_revision, patch
            )
            try:
                batch = tool_batch(WorkspaceTools(ws.path), calls)
                after, files = workspace_patch(ws.path, base=spec.base_revision)
            finally:
                self.workspaces.remove(ws)
        name = f"attempt-{inp.attempt}-turn-{inp.turn}.patch"
        patch_ref = (
            put_patch(self.store, after, run_id=inp.run_id, name=name, revision=spec.base_revision) if after else None
        )
        return AgentToolsResult(
            transcript_ref=self._put_transcript(
                inp.run_id, inp.attempt, f"tools-{inp.turn}", [*messages, *batch.messages]
            ),
            patch_ref=patch_ref,
            files_changed=files,
            summary=batch.summary,
            invalid_calls=batch.invalid_calls,
        )

    @activity.defn(name=steps.AGENT_RECORD.name)
    def agent_record(self, inp: AgentRecordInput) -> ArtifactRef:
        """The transcript with results of calls the workflow carried out itself appended; idempotent (the
        same input stores the same content)."""
        messages = decode_transcript(self.store.read_bytes(inp.transcript_ref))
        results = [tool_message(r.id, r.content) for r in inp.results]
        return self._put_transcript(inp.run_id, inp.attempt, f"record-{inp.turn}", [*messages, *results])

    @activity.defn(name=steps.AGENT_CONCLUDE.name)
    def agent_conclude(self, inp: AgentConcludeInput) -> ProposalResult:
        """Judge the attempt's patch against the mirror and store it as the proposal.

        No patch is ``NoPatch``; a patch the validation or the policy refuses is ``NoPatch`` with the reasons
        (the next attempt's prompt carries them). Failures carry no tokens: the workflow charged every turn.
        Each ``NoPatch`` says its kind in a detail (:data:`NO_PATCH_KIND`): ``no-op`` when the model's edits
        cancel out, ``refused`` when it never edited or the policy refused its patch."""
        spec = open_spec(self.store, inp.spec_ref, inp.run_id, f"to judge the patch of {inp.op_id}")
        beat = Heartbeat(f"judging the patch (attempt {inp.attempt})")
        if inp.patch_ref is None:
            edited = inp.transcript_ref is not None and made_edits(
                decode_transcript(self.store.read_bytes(inp.transcript_ref))
            )
            what = "its edits leave the code unchanged" if edited else "the model finished without changing anything"
            err = NoPatchError(f"{what}: {inp.summary}")
            raise failing(err, Spend(), beat, {NO_PATCH_KIND: NO_OP if edited else REFUSED}) from err
        patch = self.store.read_bytes(inp.patch_ref).decode()
        with beat:
            check = self.judge_patch(spec, patch)
        patch_ref = accepted_patch(self.store, check, patch, inp.run_id, inp.attempt, spec.base_revision, Spend(), beat)
        spent = Spend(prompt_tokens=inp.prompt_tokens, completion_tokens=inp.completion_tokens)
        return proposal_result(patch_ref, inp.summary, check.files, spent, inp.model)

    def _put_transcript(self, run_id: str, attempt: int, step: str, messages: list[dict[str, Any]]) -> ArtifactRef:
        return self.store.put_bytes(
            encode_transcript(messages),
            kind=ArtifactKind.OTHER,
            run_id=run_id,
            name=f"attempt-{attempt}-{step}.transcript.json",
            media_type="application/json",
        )


def attempt_request(inp: ProposePatchInput | AgentTurnInput, workspace: Path | None, earlier: Spend) -> RepairRequest:
    """What an attempt asks of its engine: in ``workspace`` (``None``: a stepped attempt, whose turns have no
    workspace of their own), with the budget left after what ``earlier`` tries spent (at least 1). A stepped
    attempt's turn also carries its revision and what the review asked for; the one-shot and the command
    engine's attempts are never revisions."""
    revision, feedback = (inp.revision, inp.review_feedback) if isinstance(inp, AgentTurnInput) else (0, "")
    return RepairRequest(
        run_id=inp.run_id,
        op_id=inp.op_id,
        attempt=inp.attempt,
        issue_title=inp.issue_title,
        issue_body=inp.issue_body,
        workspace="" if workspace is None else str(workspace),
        previous_failures=inp.previous_failures,
        token_budget=max(1, inp.token_budget - earlier.total),
        revision=revision,
        review_feedback=feedback,
    )


def proposal_result(
    patch_ref: ArtifactRef, summary: str, files: list[str], spent: Spend, model: str, log_ref: ArtifactRef | None = None
) -> ProposalResult:
    """An attempt's accepted patch (:func:`accepted_patch`) as its step's result, with the tokens it spent."""
    return ProposalResult(
        patch_ref=patch_ref,
        summary=summary,
        files_changed=files,
        prompt_tokens=spent.prompt_tokens,
        completion_tokens=spent.completion_tokens,
        model=model,
        log_ref=log_ref,
    )


def accepted_patch(
    store: ArtifactStore,
    check: PatchCheck,
    patch: str,
    run_id: str,
    attempt: int,
    base_revision: str,
    spent: Spend,
    beat: Heartbeat,
    *details: object,
) -> ArtifactRef:
    """The attempt's patch stored by content once the patch policy's ``check`` accepted it; a refusal is the
    attempt's ``NoPatch`` failure, with its reasons, what the attempt spent, and ``details``."""
    if not check.ok:
        refused = FailureClass.NO_PATCH.error("the proposed patch was refused: " + "; ".join(check.reasons))
        raise failing(refused, spent, beat, {NO_PATCH_KIND: REFUSED}, *details)
    return put_patch(store, patch, run_id=run_id, name=f"attempt-{attempt}.patch", revision=base_revision)
