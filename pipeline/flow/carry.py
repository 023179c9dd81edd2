"""What a run carries into its next execution when its review wait continues as new.

A review can last weeks, with hundreds of pushes and deliveries; Temporal caps one execution's history, so
the review wait continues as new (REVIEW_CONTINUE_AS_NEW_PATCH) whenever the server suggests it. The new
execution (same workflow ID, so queries, Updates and ``durafix status`` reach it) starts in the review wait
with exactly this: the run's state (its deliveries answered by GUID among it, so a redelivery is answered
with its first record and never handled twice), the decisions not acted on yet, what every later phase needs
(the report, spec, procedure, hosts) and the review wait's own counters. Pure values: no Temporal here.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from environments.interface import EnvironmentHandle
from evidence.interface import ArtifactRef
from pipeline.state import Approval, HeadPush, Rejection, RunState
from pipeline.steps import ReportInfo


class RunCarry(BaseModel):
    """The run's context past intake, as a workflow other than the one holding it takes it up: the run's own
    next execution (:class:`ReviewCarry`) or an attempt's child
    (:class:`~pipeline.flow.attempt_carry.AttemptInput`). The names are the run context's."""

    state: RunState
    report: ReportInfo
    spec_ref: ArtifactRef
    procedure_ref: ArtifactRef
    hosts: list[str] = Field(default_factory=list)
    live_envs: dict[str, EnvironmentHandle] = Field(default_factory=dict)
    cancellation_v2: bool = True


class ReviewCarry(RunCarry):
    """The state a run's review wait continues with in its next execution (see the module docstring)."""

    closing_note: str = ""
    approval: Approval | None = None
    rejection: Rejection | None = None
    revision_request: Rejection | None = None
    moved_head: HeadPush | None = None
    review_note: str = ""
    # The head under review and the merges tried so far (each merge's operation ID counts them).
    head: str
    renewals: int = 0
    # How many times this run has continued as new (1 in the first continued execution).
    continued: int = 0
