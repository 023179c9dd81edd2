"""Every ``workflow.patched`` ID of the ``repair_bug`` workflow, in one place, and why each exists.

A patch keeps a run recorded before a change replaying on the code after it: the new branch runs only in
runs that recorded the patch's marker. Each ID is a stable string (it is written into histories); never
rename one.
"""

from __future__ import annotations

# The cancellation state machine: a cancelled run winds down (stops its step, cleans up what it owns, says so)
# instead of failing where the cancellation found it.
CANCELLATION_PATCH = "cancellation-state-machine"
# A cancellation requested while an activity runs wins even when that activity then completes normally (it
# never heard of the cancellation: no heartbeat carried it back before it finished). Without this the run
# took the late result and went on as if never cancelled, up to the review wait.
LATE_COMPLETION_PATCH = "cancellation-wins-over-late-completion"
# The recipe's tests run once on the base revision before any repair attempt (runs recorded before it had no
# baseline, and replay without one).
BASELINE_PATCH = "baseline-tests"
# The ticket is updated when the run starts waiting for a review (runs recorded before left it at publish).
REVIEW_TICKET_PATCH = "ticket-at-review-wait"
# A run started with the report pinned at the trigger works on that text; an edit (seen at intake, or
# signalled by the receiver) is noted on the ticket, which is updated when the signal arrives.
PINNED_REPORT_PATCH = "report-pinned-at-trigger"
# The merge activity merges only on an approval the forge holds (or an allowed operator approval); when it
# finds none, the run says so on the PR and the ticket and waits for a review again.
REVIEW_ON_FORGE_PATCH = "approval-authority-on-forge"
# A repair attempt is a sequence of recorded steps (model turn, tool batch, ..., conclusion) instead of one
# ``model.propose_patch`` activity holding the conversation in memory (runs recorded before replay with it).
STEPPED_AGENT_PATCH = "stepped-agent"
# The stepped attempt offers the run tools (run_tests, run, run_reproduction), carried out in the sandbox;
# runs recorded before offered the workspace tools only.
AGENT_RUN_TOOLS_PATCH = "agent-run-tools"
# A model step whose every try failed on the transport (429, 5xx, a timeout) is waited out on a durable timer
# and sent again, up to the policy's outage allowance, instead of ending the run (runs recorded before ended
# in triage at the first such failure, and replay that way).
MODEL_OUTAGE_PATCH = "model-outage-waited-out"
# A permitted reviewer's request for changes starts a revision on top of the head under review (while the
# revision budget lasts) instead of rejecting; runs recorded before replay such a request as a rejection.
REVISIONS_PATCH = "revisions-on-review"
# A run whose policy names the external agent engine (``engine: command``) makes each attempt one
# ``model.agent_command`` activity (runs recorded before it knew no such engine).
COMMAND_ENGINE_PATCH = "command-engine"
# A decision delivered (``deliver``) while the run is still publishing, naming the run's PR and the head it
# pushed, is held and acted on when the review wait begins (before, such a review was refused or dropped).
EARLY_DECISIONS_PATCH = "decisions-held-until-review-wait"
# A head of the run's PR that the run did not push (the ``head_moved`` signal, an approval naming it, the
# merge finding the head moved) is verified before anyone is asked to review it: new evidence, a renewed
# review naming the new head and digest, or (failing) said on the PR and the ticket and the run ended. Runs
# recorded before asked for a renewed review of the unverified head, with the old evidence digest.
MOVED_HEAD_PATCH = "moved-head-verified"
# Before merging, the base branch's head is read; when it moved since the head under review was verified, the
# change is rebuilt on it and verified again (RunPolicy.base_moved says whether a same change merges as
# approved or is pushed rebuilt). Runs recorded before merged without looking at the base.
BASE_MOVED_PATCH = "moved-base-reverified"
# A run whose cleanup could not complete names on its ticket what remains and how to finish the cleanup
# (``durafix cleanup --run``); runs recorded before said only the outcome and its detail.
CLEANUP_TICKET_PATCH = "cleanup-incomplete-on-ticket"
# An environment stamped with the host holding it is reproduced, torn down and cleaned up on that host's queue
# (pipeline/hosts.py); a host that does not take such a step in time is taken for gone. Runs recorded before sent
# every step to its capability's queue.
HOST_AFFINITY_PATCH = "host-affinity"
# A step bound to a host whose last try there was lost with its worker process (the host's supervisor said so, so
# the host is alive) is sent to the host again, up to the step's own attempts; runs recorded before ended there.
HOST_WORKER_LOST_PATCH = "host-step-worker-lost-sent-again"
# The run upserts its compact recorded state (pipeline/recorded_state.py) into its memo at every phase change,
# so ``durafix status`` can say what it last recorded with no worker polling; runs recorded before issue none.
STATE_MEMO_PATCH = "state-in-memo"
# The run stores its whole state in the evidence store once it ended (``evidence.record_run``) and answers with a
# bounded one; runs recorded before issue no such step.
RUN_RECORD_PATCH = "run-record-stored"
