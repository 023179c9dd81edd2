"""A compatible change of ``repair_bug``, as a later release would deploy it: one new step behind a new patch.

:class:`ChangedRepairBug` is the current workflow plus a notice said on the PR after the review wait, right
before the merge ("merging `<head>` approved by <reviewer>"), behind :data:`MERGE_NOTICE_PATCH`. It is
registered under the same workflow name, so a worker running it takes over the runs of the current code.

Where the patch is decided matters. ``workflow.patched`` answers False only while a task that is already in
the history is replayed; a run executing new code for the first time gets True. A run that was waiting for its
review when the change was deployed executes the code after the wait for the first time on the new worker, so
a ``patched`` call placed there would send it down the new path. The decision is therefore taken where the run
*enters* review (as the product decides ``MOVED_HEAD_PATCH``): a run that entered review on the old code
replays that task without the marker and keeps the old path to its end; a run that enters review on the new
code records the marker and says the notice before its merge. Both replay without nondeterminism, and the
histories of the current code replay on this one unchanged (``tests/replay/test_changed_code.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel

    from pipeline import steps
    from pipeline.flow.context import RunContext
    from pipeline.inputs import RepairInput
    from pipeline.state import Outcome, RunState
    from pipeline.steps import Step
    from pipeline.workflow import RepairBugWorkflow

In = TypeVar("In", bound=BaseModel)
Out = TypeVar("Out")

MERGE_NOTICE_PATCH = "merge-notice-on-pr"
# The key of the notice's comment on the PR, after the run's ID (one comment per key, see reviews.comments).
NOTICE_KEY = "merge-notice"
NOTICE_TEXT = "durafix is merging"


@dataclass
class NoticeContext(RunContext):
    """The run context of the changed code: says the notice before the first merge step."""

    # Whether the notice is still to be said; None until the run enters review (a handler's step may run first).
    merge_notice: bool | None = None

    async def step(self, step: Step[In, Out], arg: In, *, host: str = "") -> Out:
        if step is steps.MERGE and self.merge_notice:
            # Said once, before the first merge attempt: a renewed review's merge says nothing more.
            self.merge_notice = False
            approval = self.state.approval
            assert approval is not None
            key = f"{self.state.workflow_id}:{NOTICE_KEY}"
            await self.say_on_pr(key, f"{NOTICE_TEXT} `{approval.head_sha}` approved by {approval.reviewer}.")
        return await super().step(step, arg, host=host)


@workflow.defn(name="repair_bug")
class ChangedRepairBug(RepairBugWorkflow):
    """``repair_bug`` with the merge notice (see the module's docstring for where its patch is decided)."""

    context_type = NoticeContext

    @workflow.run
    async def run(self, inp: RepairInput) -> RunState:
        return await super().run(inp)

    async def _review_and_merge(self) -> tuple[Outcome, str]:
        # Decided once, in the task that enters review, never in a task after the review wait.
        ctx = self._ctx
        assert isinstance(ctx, NoticeContext)
        ctx.merge_notice = workflow.patched(MERGE_NOTICE_PATCH)
        return await super()._review_and_merge()
