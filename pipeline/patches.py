"""The registry of every ``workflow.patched`` ID of the ``repair_bug`` workflow: why each exists, the recorded
history that proves its new branch replays, when it shipped and when it may be retired.

A patch keeps a run recorded before a change replaying on the code after it: the new branch runs only in
runs that recorded the patch's marker, the old one only in runs that started before the patch shipped. Each ID
is a stable string (it is written into histories); never rename or reuse one, not even after its removal.

The life of a patch (``docs/architecture.md``, "Shipping a change to the workflow"):

1. **active**: the workflow calls ``workflow.patched(ID)`` and keeps both branches. No run started before the
   patch shipped can still be running after :attr:`Patch.needed_until` (shipped + the run deadline): from the
   day after, the old branch is dead code.
2. **deprecated**: the old branch is deleted and the call becomes ``workflow.deprecate_patch(ID)``, which
   tells runs recorded with the marker that its absence is expected from now on. :attr:`Patch.deprecated` is
   the date that release shipped.
3. **removed**: after :attr:`Patch.marker_needed_until` (deprecated + the run deadline) no run recorded with
   the call is left; the call is deleted. The entry stays here, so its ID is never given to another change.

``tests/replay/test_patch_registry.py`` holds the registry to this: every call site in ``pipeline/`` names a
constant registered here in the stage its call says, each active or deprecated patch names fixtures in
``tests/replay/histories/`` that record its marker, and an active patch past its date fails the test until it
is deprecated.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from enum import StrEnum

from pipeline.policies import RunPolicy

# The longest a run can live (Temporal's execution timeout, which spans continue-as-new and retries): a run
# started before a release is gone, one way or another, this long after it.
RUN_DEADLINE = timedelta(seconds=RunPolicy().run_deadline_s)


class Stage(StrEnum):
    """Where a patch is in its life; which call the workflow makes for it."""

    ACTIVE = "active"  # ``workflow.patched(ID)``, both branches kept
    DEPRECATED = "deprecated"  # ``workflow.deprecate_patch(ID)``, the old branch gone
    REMOVED = "removed"  # no call left; the ID stays reserved


@dataclass(frozen=True)
class Patch:
    """One ``workflow.patched`` ID.

    ``fixtures`` are names (without ``.json``) of histories in ``tests/replay/histories/`` whose history records
    this patch's marker, so the replay test proves the new branch replays; an active or deprecated patch names
    at least one. ``shipped`` is the date the release carrying the patch reached the workers (the commit date
    of the change that added the ID: this project ships from its main branch); ``deprecated`` and ``removed``
    the dates the next two steps shipped.
    """

    id: str
    why: str
    fixtures: tuple[str, ...]
    shipped: date
    deprecated: date | None = None
    removed: date | None = None

    @property
    def stage(self) -> Stage:
        if self.removed is not None:
            return Stage.REMOVED
        if self.deprecated is not None:
            return Stage.DEPRECATED
        return Stage.ACTIVE

    @property
    def needed_until(self) -> date:
        """The last day a run started before the patch shipped (taking the old branch) can still be running."""
        return self.shipped + RUN_DEADLINE

    @property
    def marker_needed_until(self) -> date | None:
        """The last day a run that called ``workflow.patched`` (before the deprecation shipped) can still be
        running; ``None`` while the patch is active."""
        return None if self.deprecated is None else self.deprecated + RUN_DEADLINE

    def overdue(self, today: date) -> str | None:
        """What must be done to this patch as of ``today`` (its next step is due), or ``None``."""
        if self.stage is Stage.ACTIVE and today > self.needed_until:
            return (
                f"patch {self.id!r} shipped {self.shipped} and no run can still need its old branch after "
                f"{self.needed_until}: delete the old branch and deprecate it (workflow.deprecate_patch, set "
                "`deprecated` in pipeline/patches.py)"
            )
        until = self.marker_needed_until
        if self.stage is Stage.DEPRECATED and until is not None and today > until:
            return (
                f"patch {self.id!r} was deprecated {self.deprecated} and no run can still have recorded its "
                f"marker after {until}: remove its workflow.deprecate_patch call and set `removed`"
            )
        return None


CANCELLATION_PATCH = "cancellation-state-machine"
LATE_COMPLETION_PATCH = "cancellation-wins-over-late-completion"
BASELINE_PATCH = "baseline-tests"
REVIEW_TICKET_PATCH = "ticket-at-review-wait"
PINNED_REPORT_PATCH = "report-pinned-at-trigger"
REVIEW_ON_FORGE_PATCH = "approval-authority-on-forge"
STEPPED_AGENT_PATCH = "stepped-agent"
AGENT_RUN_TOOLS_PATCH = "agent-run-tools"
MODEL_OUTAGE_PATCH = "model-outage-waited-out"
REVISIONS_PATCH = "revisions-on-review"
COMMAND_ENGINE_PATCH = "command-engine"
EARLY_DECISIONS_PATCH = "decisions-held-until-review-wait"
MOVED_HEAD_PATCH = "moved-head-verified"
BASE_MOVED_PATCH = "moved-base-reverified"
CLEANUP_TICKET_PATCH = "cleanup-incomplete-on-ticket"
HOST_AFFINITY_PATCH = "host-affinity"
HOST_WORKER_LOST_PATCH = "host-step-worker-lost-sent-again"
STATE_MEMO_PATCH = "state-in-memo"
REVIEW_CONTINUE_AS_NEW_PATCH = "review-wait-continues-as-new"
RUN_RECORD_PATCH = "run-record-stored"
ATTEMPT_CHILD_PATCH = "repair-attempt-child-workflow"
REPRODUCTION_SEED_PATCH = "test-reproduction-seeds-repair"
DRAFTS_RUN_ON_BASE_PATCH = "drafts-run-on-base"
CHECKS_SIDE_BY_SIDE_PATCH = "checks-side-by-side"

PATCHES: tuple[Patch, ...] = (
    Patch(
        CANCELLATION_PATCH,
        "A cancelled run winds down (stops its step, cleans up what it owns, says so) instead of failing where "
        "the cancellation found it.",
        fixtures=("cancelled",),
        shipped=date(2026, 11, 29),
    ),
    Patch(
        LATE_COMPLETION_PATCH,
        "A cancellation requested while an activity runs wins even when that activity then completes normally "
        "(no heartbeat carried the cancellation back before it finished). Without it the run took the late "
        "result and went on as if never cancelled, up to the review wait.",
        fixtures=("cancelled-after-late-completion",),
        shipped=date(2026, 11, 29),
    ),
    Patch(
        BASELINE_PATCH,
        "The recipe's tests run once on the base revision before any repair attempt; runs recorded before had "
        "no baseline and replay without one.",
        fixtures=("happy-path-baseline", "baseline-cannot-run"),
        shipped=date(2026, 12, 1),
    ),
    Patch(
        REVIEW_TICKET_PATCH,
        "The ticket is updated when the run starts waiting for a review; runs recorded before left it at publish.",
        fixtures=("happy-path-baseline",),
        shipped=date(2026, 12, 1),
    ),
    Patch(
        PINNED_REPORT_PATCH,
        "A run started with the report pinned at the trigger works on that text; an edit (seen at intake, or "
        "signalled by the receiver) is noted on the ticket, which is updated when the signal arrives.",
        fixtures=("report-edited-after-trigger",),
        shipped=date(2026, 12, 1),
    ),
    Patch(
        REVIEW_ON_FORGE_PATCH,
        "The merge activity merges only on an approval the forge holds (or an allowed operator approval); when "
        "it finds none, the run says so on the PR and the ticket and waits for a review again.",
        fixtures=("review-authority-on-forge",),
        shipped=date(2026, 12, 1),
    ),
    Patch(
        STEPPED_AGENT_PATCH,
        "A repair attempt is a sequence of recorded steps (model turn, tool batch, ..., conclusion) instead of "
        "one model.propose_patch activity holding the conversation in memory.",
        fixtures=("stepped-attempt-killed",),
        shipped=date(2026, 12, 1),
    ),
    Patch(
        AGENT_RUN_TOOLS_PATCH,
        "The stepped attempt offers the run tools (run_tests, run, run_reproduction), carried out in the "
        "sandbox; runs recorded before offered the workspace tools only.",
        fixtures=("revision-on-review",),
        shipped=date(2026, 12, 1),
    ),
    Patch(
        MODEL_OUTAGE_PATCH,
        "A model step whose every try failed on the transport (429, 5xx, a timeout) is waited out on a durable "
        "timer and sent again, up to the policy's outage allowance, instead of ending the run in triage.",
        fixtures=("model-outage-waited-out", "model-outage-allowance-spent"),
        shipped=date(2026, 12, 1),
    ),
    Patch(
        REVISIONS_PATCH,
        "A permitted reviewer's request for changes starts a revision on top of the head under review (while "
        "the revision budget lasts) instead of rejecting; runs recorded before replay it as a rejection.",
        fixtures=("revision-on-review",),
        shipped=date(2026, 12, 1),
    ),
    Patch(
        COMMAND_ENGINE_PATCH,
        "A run whose policy names the external agent engine (engine: command) makes each attempt one "
        "model.agent_command activity; runs recorded before knew no such engine.",
        fixtures=("command-engine-awaiting-review",),
        shipped=date(2026, 12, 1),
    ),
    Patch(
        EARLY_DECISIONS_PATCH,
        "A decision delivered while the run is still publishing, naming the run's PR and the head it pushed, is "
        "held and acted on when the review wait begins; before, such a review was refused or dropped.",
        fixtures=("decision-held-until-review-wait",),
        shipped=date(2026, 12, 1),
    ),
    Patch(
        MOVED_HEAD_PATCH,
        "A head of the run's PR that the run did not push (the head_moved signal, an approval naming it, the "
        "merge finding the head moved) is verified before anyone is asked to review it; runs recorded before "
        "asked for a renewed review of the unverified head, with the old evidence digest.",
        fixtures=("awaiting-review-before-change", "finished-on-changed-code"),
        shipped=date(2026, 12, 1),
    ),
    Patch(
        BASE_MOVED_PATCH,
        "Before merging, the base branch's head is read; when it moved since the head under review was "
        "verified, the change is rebuilt on it and verified again (RunPolicy.base_moved). Runs recorded before "
        "merged without looking at the base.",
        fixtures=("finished-on-changed-code",),
        shipped=date(2026, 12, 1),
    ),
    Patch(
        CLEANUP_TICKET_PATCH,
        "A run whose cleanup could not complete names on its ticket what remains and how to finish the cleanup "
        "(durafix cleanup --run); runs recorded before said only the outcome and its detail.",
        fixtures=("cleanup-incomplete",),
        shipped=date(2026, 12, 2),
    ),
    Patch(
        HOST_AFFINITY_PATCH,
        "An environment stamped with the host holding it is reproduced, torn down and cleaned up on that "
        "host's queue; a host that does not take such a step in time is taken for gone. Runs recorded before "
        "sent every step to its capability's queue.",
        fixtures=("host-affinity", "host-step-worker-lost-sent-again"),
        shipped=date(2026, 12, 2),
    ),
    Patch(
        HOST_WORKER_LOST_PATCH,
        "A step bound to a host whose last try there was lost with its worker process (the host's supervisor "
        "said so: the host is alive) is sent to the host again, up to the step's own attempts; runs recorded "
        "before ended there.",
        fixtures=("host-step-worker-lost-sent-again",),
        shipped=date(2026, 12, 3),
    ),
    Patch(
        STATE_MEMO_PATCH,
        "The run upserts its compact recorded state (pipeline/recorded_state.py) into its memo at every phase "
        "change, so durafix status can say what it last recorded with no worker polling; runs recorded before "
        "issue none.",
        fixtures=("cleanup-incomplete", "host-affinity"),
        shipped=date(2026, 12, 2),
    ),
    Patch(
        REVIEW_CONTINUE_AS_NEW_PATCH,
        "The review wait continues as new whenever the server suggests it, carrying exactly its state "
        "(pipeline/flow/carry.py), so a review of weeks stays inside Temporal's history limits; runs recorded "
        "before waited in one execution.",
        fixtures=("review-continued-as-new",),
        shipped=date(2026, 12, 4),
    ),
    Patch(
        RUN_RECORD_PATCH,
        "The run stores its whole state in the evidence store once it ended (evidence.record_run) and answers "
        "with a bounded one; runs recorded before issue no such step.",
        fixtures=("review-resumed-merged",),
        shipped=date(2026, 12, 4),
    ),
    Patch(
        ATTEMPT_CHILD_PATCH,
        "Each stepped repair attempt and revision runs as a child workflow (repair_attempt, "
        "pipeline/flow/attempt.py), so its turns stay out of the run's history; runs recorded before ran "
        "every turn in their own.",
        fixtures=("repair-attempts-as-children",),
        shipped=date(2026, 12, 5),
    ),
    Patch(
        REPRODUCTION_SEED_PATCH,
        "A run whose reproduction is a test writes its test files on the base (env.reproduction_seed) once "
        "before the first repair attempt, and every attempt that would start from nothing starts from them, so "
        "the candidate, its PR and its regression proof hold the test. Asked only by runs with a test "
        "reproduction: browser runs issue the commands they always did.",
        fixtures=("test-reproduction-seeded",),
        shipped=date(2026, 12, 6),
    ),
    Patch(
        DRAFTS_RUN_ON_BASE_PATCH,
        "A report with no reproduction gets the spec first, then what the drafter is told of the repository "
        "(env.draft_context), then drafts of any kind the recipe can run, each run on the base and sent back "
        "with what it found until one shows the bug; runs recorded before drafted one browser procedure, "
        "validated only, before the spec. Asked only by runs whose report has no reproduction.",
        fixtures=("drafted-reproduction-refused-then-accepted",),
        shipped=date(2026, 12, 6),
    ),
    Patch(
        CHECKS_SIDE_BY_SIDE_PATCH,
        "Independent checks run side by side (pipeline/flow/side_by_side.py): the baseline tests beside the base "
        "reproduction, and a candidate's reproduction replayed beside its tests (env.verify_candidate), its "
        "outputs tagged with the candidate's commit once that step made it; a failing check cancels the checks "
        "still running beside it, except a baseline whose setup failed: held for the base reproduction, which runs "
        "the same setup and names the cause (unrecorded when it fails, judged after it when it reproduced). Runs "
        "recorded before ran each after the other (the ticket update between the base reproduction and the "
        "baseline). A run whose base reproduction was a drafted one's asks it only in "
        "verification.",
        fixtures=("checks-side-by-side", "checks-side-by-side-setup-fails"),
        shipped=date(2026, 12, 6),
    ),
)

BY_ID: dict[str, Patch] = {p.id: p for p in PATCHES}
