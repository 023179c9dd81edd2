"""What one repair attempt's child workflow (``repair_attempt``) is given and gives back.

A stepped attempt is up to :data:`pipeline.steps.AGENT_MAX_TURNS` model turns, each with its tool steps: in the
run's own history, three such attempts would be thousands of events. So each attempt (and each revision) runs
as a child workflow of the run (ATTEMPT_CHILD_PATCH): the parent's history holds the child's start and its one
result, the turns stay in the child's, and the agent's own changes are confined to a workflow that lives
for minutes.

The child works on a copy of the run's state (:func:`attempt_state`: without the lists only the run's
handlers grow) and gives back the parts an attempt changes (budgets, evidence, timeline, environment, hosts,
live environments), in every ending: with its proposal, with the run's ending
(:class:`AttemptOutcome.ended`), cancelled, or, when a step failed, as the first detail of an
``ApplicationError`` of type :data:`ATTEMPT_STEP_FAILED` whose cause is the step's own failure, which the
parent raises again as it was. Operation IDs are the run's (the child's state names the run's workflow ID), so
every step stays idempotent across a retried child exactly as inside the run. Pure values: no Temporal here.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from environments.interface import EnvironmentHandle
from evidence.interface import ArtifactRef
from pipeline.flow.carry import RunCarry
from pipeline.inputs import RepairInput
from pipeline.state import Outcome, RunState
from pipeline.steps import ProposalResult
from repair.context import EarlierAttempt

ATTEMPT_WORKFLOW = "repair_attempt"
# The type of the failure a child ends with when one of its steps failed: its cause is that step's failure.
ATTEMPT_STEP_FAILED = "AttemptStepFailed"


# Lists only the run's own handlers and review grow, which no attempt reads: the child starts without them,
# so a run that has handled hundreds of deliveries does not copy them into every attempt's input and result.
NOT_FOR_ATTEMPTS = ("deliveries", "report_edits", "head_pushes")


def attempt_state(run: RunState) -> RunState:
    """The copy of the run's state an attempt starts with: all of it but :data:`NOT_FOR_ATTEMPTS`, which
    :func:`take_back` never copies back."""
    return run.model_copy(update={name: [] for name in NOT_FOR_ATTEMPTS}, deep=True)


def take_back(run: RunState, attempt: RunState) -> None:
    """Into ``run``, the parts of the run's state an attempt changes, as ``attempt`` (the child's copy) has
    them; the rest stays the run's (its handlers may have changed it meanwhile). In place: the phases hold
    the budgets object and the lists while an attempt runs."""
    for name in type(attempt.budgets).model_fields:
        setattr(run.budgets, name, getattr(attempt.budgets, name))
    run.evidence[:] = attempt.evidence
    run.timeline[:] = attempt.timeline
    run.phase = attempt.phase
    run.environment = attempt.environment


class AttemptSpec(BaseModel):
    """What one stepped attempt is: its number, operation ID, what it is told, and where it starts. A revision
    starts from ``start_patch`` (the patch under review) and opens with what the review asked for."""

    attempt: int
    repair_op: str
    failures: list[EarlierAttempt]
    token_budget: int
    start_patch: ArtifactRef | None = None
    revision: int = 0
    review_feedback: str = ""


class AttemptInput(RunCarry):
    """What the child starts with: the run's input (without a carried review state), a copy of its state, and
    what every step of an attempt needs."""

    run: RepairInput
    order: AttemptSpec


class AttemptOutcome(BaseModel):
    """How the attempt ended, and the state it leaves (see the module docstring)."""

    state: RunState
    hosts: list[str] = Field(default_factory=list)
    live_envs: dict[str, EnvironmentHandle] = Field(default_factory=dict)
    proposal: ProposalResult | None = None
    ended: Outcome | None = None
    ended_detail: str = ""
    cancelled: bool = False
