"""Temporal activities of the model queue.

``model.propose_patch`` rebuilds a scratch workspace at the base revision (never reusing an earlier
attempt's edits), lets the engine edit it, validates the resulting patch against the base revision, and
stores it by content. A retry of the activity asks the model again (and spends tokens again): the model
call is not idempotent, which is why the workflow records the proposal it keeps and never re-asks for an
attempt that completed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
    ModelPermanentError,
    ModelTransientError,
    NoPatchError,
    RepairBudgetError,
    RepairError,
    RepairRequest,
)
from repair.patch import validate_patch
from repair.procedure_draft import ProcedureDrafter, ProcedureDraftError


def _with_tokens(err: ApplicationError, source: RepairError) -> ApplicationError:
    """Failures carry the tokens they spent, so the workflow's budget stays honest."""
    return ApplicationError(
        err.message,
        {"prompt_tokens": source.prompt_tokens, "completion_tokens": source.completion_tokens},
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
        try:
            with Heartbeat("drafting a reproduction procedure"):
                draft = drafter.draft(inp.issue_title, inp.issue_body, inp.op_id)
        except ModelTransientError as err:
            raise _with_tokens(failures.transient(f"model: {err}", err.retry_after), err) from err
        except ProcedureDraftError as err:
            raise _with_tokens(failures.procedure_invalid(f"no valid procedure drafted: {err}"), err) from err
        except (ModelPermanentError, RepairBudgetError) as err:
            raise _with_tokens(failures.permanent(f"model: {err}"), err) from err
        ref = self.services.store.put_bytes(
            draft.procedure.model_dump_json(indent=2).encode(),
            kind=ArtifactKind.PROCEDURE,
            run_id=inp.run_id,
            name="drafted-procedure.json",
            media_type="application/json",
        )
        return ProcedureResult(
            procedure_ref=ref,
            drafted=True,
            prompt_tokens=draft.prompt_tokens,
            completion_tokens=draft.completion_tokens,
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
        ws = workspaces.rebuild(
            run_id=inp.run_id,
            op_id=inp.op_id,
            clone_url=spec.clone_url,
            base_revision=spec.base_revision,
            token=self.services.config.forge_token or None,
        )
        try:
            with Heartbeat(f"asking the model (attempt {inp.attempt})"):
                proposal = self.services.engine.propose(
                    RepairRequest(
                        run_id=inp.run_id,
                        op_id=inp.op_id,
                        attempt=inp.attempt,
                        issue_title=inp.issue_title,
                        issue_body=inp.issue_body,
                        workspace=str(ws.path),
                        previous_failures=inp.previous_failures,
                        token_budget=max(1, inp.token_budget),
                    )
                )
            check = validate_patch(ws.path, proposal.patch, base=spec.base_revision)
        except ModelTransientError as err:
            raise _with_tokens(failures.transient(f"model: {err}", err.retry_after), err) from err
        except RepairBudgetError as err:
            raise _with_tokens(failures.budget(f"model budget: {err}"), err) from err
        except NoPatchError as err:
            raise _with_tokens(failures.no_patch(f"no patch: {err}"), err) from err
        except ModelPermanentError as err:
            raise _with_tokens(failures.permanent(f"model: {err}"), err) from err
        finally:
            workspaces.remove(ws)
        if not check.ok:
            raise failures.no_patch("the proposed patch was refused: " + "; ".join(check.reasons))
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
            prompt_tokens=proposal.prompt_tokens,
            completion_tokens=proposal.completion_tokens,
            model=proposal.model,
        )
