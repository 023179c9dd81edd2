"""The model queue's activities.

``model.propose_patch`` rebuilds a scratch workspace at the base revision (never reusing an earlier
attempt's edits), lets the engine edit it, validates the resulting patch against the base revision, and
stores it by content. A retry of the activity asks the model again (and spends tokens again): the model
call is not idempotent, which is why the workflow records the proposal it keeps and never re-asks for an
attempt that completed.

Runs started since the stepped attempt (``workflow.patched("stepped-agent")``) ask for patches through the
steps of :mod:`pipeline.activities.agent` instead; ``model.propose_patch`` stays registered for the runs
recorded before it.

Token accounting across retries: what every attempt spent is carried to the next attempt in the last
heartbeat's details (sent also just before a failure), so a result or a final failure reports the tokens of
all attempts of the activity, and a retry gets only the budget that is left. Tokens of an attempt whose
worker was killed mid-call are unknown and not counted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from temporalio import activity

from environments.reproduction import describe, needs_app, stored_form
from environments.workspace import WorkspaceManager
from evidence.interface import ArtifactKind, ArtifactStore
from evidence.sandbox_view import DRAFTED_PROCEDURE_NAME
from pipeline import steps
from pipeline.activities.agent import AgentActivities, accepted_patch, attempt_request, proposal_result
from pipeline.activities.agent_command import CommandActivities
from pipeline.activities.heartbeat import Heartbeat
from pipeline.activities.spend import budgeted, earlier_attempts_spend, failing
from pipeline.activities.workspace import PatchingActivities, open_spec, rebuild
from pipeline.steps import DraftProcedureInput, ProcedureResult, ProposalResult, ProposePatchInput
from repair.interface import RepairEngine, RepairError
from repair.openai_calls import ChatEndpoint
from repair.openai_engine import OpenAIToolEngine
from repair.patch_policy import PatchPolicy
from repair.procedure_draft import ProcedureDrafter
from reviews.git_credentials import GitCredentials


class ModelActivities(PatchingActivities):
    def __init__(
        self,
        store: ArtifactStore,
        workspaces: WorkspaceManager,
        engine: Callable[[], RepairEngine],
        drafter: Callable[[], ProcedureDrafter],
        git_token: GitCredentials,
        patch_policies: Mapping[str, PatchPolicy] | None = None,
        endpoint: Callable[[], ChatEndpoint] | None = None,
        command: CommandActivities | None = None,
    ) -> None:
        """``engine``, ``drafter`` and ``endpoint`` are made on first use, so a host only builds the clients it
        needs. ``patch_policies`` is the operator's, per repository (:func:`repair.patch_policy.policy_for`).
        ``endpoint`` serves the stepped attempt's turns (:mod:`pipeline.activities.agent`); without it they go
        to the engine's endpoint. ``command`` serves the external agent engine (``model.agent_command``)."""
        super().__init__(store, workspaces, git_token, patch_policies)
        self.engine = engine
        self.drafter = drafter
        self.agent = AgentActivities(
            store, workspaces, endpoint or self._engine_endpoint, git_token, patch_policies=self.patch_policies
        )
        self.command = command

    def all(self) -> Sequence[Callable[..., object]]:
        """``model.propose_patch`` (runs recorded before the stepped attempt replay with it), procedure
        drafting, the stepped attempt's steps, and the external agent engine's when given."""
        return [
            self.propose_patch,
            self.draft_procedure,
            *self.agent.all(),
            *(self.command.all() if self.command else []),
        ]

    def _engine_endpoint(self) -> ChatEndpoint:
        engine = self.engine()
        if not isinstance(engine, OpenAIToolEngine):
            raise TypeError(f"the stepped attempt needs a chat endpoint; {type(engine).__name__} has none")
        return engine.endpoint

    @activity.defn(name=steps.DRAFT_PROCEDURE.name)
    def draft_procedure(self, inp: DraftProcedureInput) -> ProcedureResult:
        """Draft a reproduction (of the kinds the input offers) from the report's prose and store it by content.

        Not idempotent at the model (a retry asks again); the workflow records the reference it gets and
        never asks again for a run that has one. A model that never produces a valid procedure is a
        finding (``ProcedureInvalid``): the report needs a human.
        """
        earlier = earlier_attempts_spend()
        beat = Heartbeat("drafting a reproduction procedure", carry={"spent": earlier.model_dump()})
        try:
            with beat:
                draft = self.drafter().draft(
                    inp.issue_title,
                    inp.issue_body,
                    inp.op_id,
                    kinds=inp.kinds,
                    facts=inp.facts,
                    previous=inp.previous,
                )
        except RepairError as err:
            raise failing(err, earlier.plus(err.prompt_tokens, err.completion_tokens), beat) from err
        # Stored as a reported one is (a browser procedure exactly as before kinds existed).
        ref = self.store.put_bytes(
            stored_form(draft.procedure),
            kind=ArtifactKind.PROCEDURE,
            run_id=inp.run_id,
            name=DRAFTED_PROCEDURE_NAME,
            media_type="application/json",
        )
        spent = earlier.plus(draft.prompt_tokens, draft.completion_tokens)
        return ProcedureResult(
            procedure_ref=ref,
            drafted=True,
            kind=draft.kind,
            app=needs_app(draft.procedure),
            prompt_tokens=spent.prompt_tokens,
            completion_tokens=spent.completion_tokens,
            drafted_yaml=draft.procedure_yaml,
            described=describe(draft.procedure),
        )

    @activity.defn(name=steps.PROPOSE_PATCH.name)
    def propose_patch(self, inp: ProposePatchInput) -> ProposalResult:
        spec = open_spec(self.store, inp.spec_ref, inp.run_id, f"to rebuild a workspace for {inp.op_id}")
        # Checked before the workspace is rebuilt: a retry with no budget left needs none.
        earlier, beat = budgeted(f"asking the model (attempt {inp.attempt})", inp.token_budget, "attempt")
        ws = rebuild(self.workspaces, self.git_token, inp.run_id, inp.op_id, spec.clone_url, spec.base_revision)
        try:
            with beat:
                proposal = self.engine().propose(attempt_request(inp, ws.path, earlier))
            check = self.judge_patch(spec, proposal.patch)
        except RepairError as err:
            raise failing(err, earlier.plus(err.prompt_tokens, err.completion_tokens), beat) from err
        finally:
            self.workspaces.remove(ws)
        spent = earlier.plus(proposal.prompt_tokens, proposal.completion_tokens)
        patch_ref = accepted_patch(
            self.store, check, proposal.patch, inp.run_id, inp.attempt, spec.base_revision, spent, beat
        )
        return proposal_result(patch_ref, proposal.summary, proposal.files_changed, spent, proposal.model)
