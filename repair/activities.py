"""Temporal activities of the model queue.

``model.propose_patch`` rebuilds a scratch workspace at the base revision (never reusing an earlier
attempt's edits), lets the engine edit it, validates the resulting patch against the base revision, and
stores it by content. A retry of the activity asks the model again (and spends tokens again): the model
call is not idempotent, which is why the workflow records the proposal it keeps and never re-asks for an
attempt that completed.

Token accounting across retries: what every attempt spent is carried to the next attempt in the last
heartbeat's details (sent also just before a failure), so a result or a final failure reports the tokens of
all attempts of the activity, and a retry gets only the budget that is left. Tokens of an attempt whose
worker was killed mid-call are unknown and not counted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pydantic import BaseModel
from temporalio import activity
from temporalio.exceptions import ApplicationError

from environments.interface import RunFencedError
from environments.run_fence import ensure_not_fenced
from environments.spec import spec_from_json
from evidence.interface import ArtifactKind
from pipeline import failures
from pipeline.heartbeat import Heartbeat
from pipeline.services import Services
from pipeline.steps import DraftProcedureInput, ProcedureResult, ProposalResult, ProposePatchInput
from repair.interface import (
    ModelTransientError,
    NoPatchError,
    RepairBudgetError,
    RepairError,
    RepairRequest,
)
from repair.patch import validate_patch
from repair.procedure_draft import ProcedureDrafter, ProcedureDraftError


class Spend(BaseModel):
    """Tokens a model activity spent, summed over its attempts so far."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def plus(self, prompt_tokens: int, completion_tokens: int) -> Spend:
        return Spend(
            prompt_tokens=self.prompt_tokens + prompt_tokens,
            completion_tokens=self.completion_tokens + completion_tokens,
        )


def earlier_attempts_spend() -> Spend:
    """What this activity's earlier attempts spent, from the heartbeat details Temporal handed to this one."""
    for detail in reversed(activity.info().heartbeat_details):
        if isinstance(detail, dict) and isinstance(detail.get("spent"), dict):
            return Spend.model_validate(detail["spent"])
    return Spend()


def _model_failure(err: RepairError) -> ApplicationError:
    """The failure class of an engine error: transient is retried, the rest are findings or policy."""
    if isinstance(err, ModelTransientError):
        return failures.transient(f"model: {err}", err.retry_after)
    if isinstance(err, ProcedureDraftError):
        return failures.procedure_invalid(f"no valid procedure drafted: {err}")
    if isinstance(err, RepairBudgetError):
        return failures.budget(f"model budget: {err}")
    if isinstance(err, NoPatchError):
        return failures.no_patch(f"no patch: {err}")
    return failures.permanent(f"model: {err}")


def _failing(err: ApplicationError, spent: Spend, beat: Heartbeat) -> ApplicationError:
    """``err`` carrying every attempt's tokens so far (the workflow counts a final failure's), which the last
    heartbeat also hands to the next attempt."""
    beat.carry["spent"] = spent.model_dump()
    beat.set(f"failed ({err.type}); {spent.total} tokens spent so far")
    return ApplicationError(
        err.message,
        spent.model_dump(),
        type=err.type,
        non_retryable=err.non_retryable,
        next_retry_delay=err.next_retry_delay,
    )


class ModelActivities:
    def __init__(self, services: Services) -> None:
        self.services = services

    def all(self) -> Sequence[Callable[..., object]]:
        return [self.propose_patch, self.draft_procedure]

    @activity.defn(name="model.draft_procedure")
    def draft_procedure(self, inp: DraftProcedureInput) -> ProcedureResult:
        """Draft a reproduction procedure from the report's prose and store it by content.

        Not idempotent at the model (a retry asks again); the workflow records the reference it gets and
        never asks again for a run that has one. A model that never produces a valid procedure is a
        finding (``ProcedureInvalid``): the report needs a human.
        """
        config = self.services.config
        drafter = ProcedureDrafter(config.model_base_url, config.model_api_key, config.model_name, timeout_s=120.0)
        earlier = earlier_attempts_spend()
        beat = Heartbeat("drafting a reproduction procedure", carry={"spent": earlier.model_dump()})
        try:
            with beat:
                draft = drafter.draft(inp.issue_title, inp.issue_body, inp.op_id)
        except RepairError as err:
            raise _failing(_model_failure(err), earlier.plus(err.prompt_tokens, err.completion_tokens), beat) from err
        ref = self.services.store.put_bytes(
            draft.procedure.model_dump_json(indent=2).encode(),
            kind=ArtifactKind.PROCEDURE,
            run_id=inp.run_id,
            name="drafted-procedure.json",
            media_type="application/json",
        )
        spent = earlier.plus(draft.prompt_tokens, draft.completion_tokens)
        return ProcedureResult(
            procedure_ref=ref,
            drafted=True,
            prompt_tokens=spent.prompt_tokens,
            completion_tokens=spent.completion_tokens,
        )

    @activity.defn(name="model.propose_patch")
    def propose_patch(self, inp: ProposePatchInput) -> ProposalResult:
        store = self.services.store
        spec = spec_from_json(store.read_bytes(inp.spec_ref))
        workspaces = self.services.workspaces
        try:
            ensure_not_fenced(store, inp.run_id, f"to rebuild a workspace for {inp.op_id}")
        except RunFencedError as err:
            raise failures.policy(f"run fenced: {err}") from err
        earlier = earlier_attempts_spend()
        beat = Heartbeat(f"asking the model (attempt {inp.attempt})", carry={"spent": earlier.model_dump()})
        # Checked before the workspace is rebuilt: a retry with no budget left needs none.
        if earlier.total >= inp.token_budget:
            raise _failing(
                failures.budget(f"model budget: earlier tries of this attempt spent {earlier.total} tokens"),
                earlier,
                beat,
            )
        ws = workspaces.rebuild(
            run_id=inp.run_id,
            op_id=inp.op_id,
            clone_url=spec.clone_url,
            base_revision=spec.base_revision,
            token=self.services.config.forge_token or None,
        )
        try:
            with beat:
                proposal = self.services.engine.propose(
                    RepairRequest(
                        run_id=inp.run_id,
                        op_id=inp.op_id,
                        attempt=inp.attempt,
                        issue_title=inp.issue_title,
                        issue_body=inp.issue_body,
                        workspace=str(ws.path),
                        previous_failures=inp.previous_failures,
                        token_budget=max(1, inp.token_budget - earlier.total),
                    )
                )
            check = validate_patch(ws.path, proposal.patch, base=spec.base_revision)
        except RepairError as err:
            raise _failing(_model_failure(err), earlier.plus(err.prompt_tokens, err.completion_tokens), beat) from err
        finally:
            workspaces.remove(ws)
        spent = earlier.plus(proposal.prompt_tokens, proposal.completion_tokens)
        if not check.ok:
            refused = failures.no_patch("the proposed patch was refused: " + "; ".join(check.reasons))
            raise _failing(refused, spent, beat)
        patch_ref = store.put_bytes(
            proposal.patch.encode(),
            kind=ArtifactKind.PATCH,
            run_id=inp.run_id,
            name=f"attempt-{inp.attempt}.patch",
            revision=spec.base_revision,
            media_type="text/x-diff",
        )
        return ProposalResult(
            patch_ref=patch_ref,
            summary=proposal.summary,
            files_changed=proposal.files_changed,
            prompt_tokens=spent.prompt_tokens,
            completion_tokens=spent.completion_tokens,
            model=proposal.model,
        )
