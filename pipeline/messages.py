"""Texts the run writes to the forge: ticket status, commit message, PR title/body, evidence comment.

Pure functions of the run's state (deterministic, safe inside the workflow). Hidden markers that make
these objects findable are added by the forge adapter, not here.
"""

from __future__ import annotations

import re

from environments.reproduction import ReproductionKind
from pipeline.state import (
    CandidateFact,
    CleanupFact,
    DraftingFact,
    EnvironmentFailureFact,
    Outcome,
    Phase,
    RunState,
    TriageFact,
    TriageReason,
    VerificationStatus,
)
from pipeline.steps import EvidenceResult

_OUTCOME_TEXT = {
    Outcome.MERGED: "merged: the fix is on the base branch",
    Outcome.REJECTED: "rejected: the fix was not accepted",
    Outcome.NEEDS_HUMAN_TRIAGE: "needs human triage",
    Outcome.REPAIR_BUDGET_EXHAUSTED: "repair budget exhausted: no candidate passed verification",
    Outcome.CANCELLED: "cancelled",
    Outcome.CLEANUP_INCOMPLETE: "cleanup incomplete: some resources of this run remain",
    Outcome.AMBIGUOUS_NEEDS_HUMAN: "ambiguous: a human must check the forge's state",
}


def ticket_body(state: RunState, note: str = "") -> str:
    """The status comment kept up to date on the triggering issue."""
    doing = "is working on this report" if state.outcome is None else "has finished with this report"
    lines = [f"**durafix** {doing} (`{state.workflow_id}`).", ""]
    if state.outcome is not None:
        lines.append(f"- outcome: **{_OUTCOME_TEXT[state.outcome]}**")
        if state.outcome_detail:
            lines.append(f"- detail: {state.outcome_detail}")
        if state.triage is not None:
            lines.extend(f"- {line}" for line in triage_lines(state.triage))
    else:
        lines.append(f"- phase: `{state.phase.value}`")
    if state.target_revision:
        lines.append(f"- base revision: `{state.target_revision}`")
    if state.environment is not None and state.environment.sandbox == "unsandboxed":
        lines.append(
            "- sandbox: **none**: this worker runs the repository's commands and the model's code as plain host "
            "processes (DURAFIX_UNSANDBOXED=1)"
        )
    if state.drafting is not None:
        lines.append(f"- {drafting_text(state.drafting)}")
    if state.reproduction is not None:
        lines.append(f"- reproduction on base{kind_said(state)}: `{state.reproduction.status}`")
    if state.baseline is not None:
        verdict = "passed" if state.baseline.passed else ("failed" if state.baseline.runnable else "cannot run")
        lines.append(f"- recipe tests on base: `{verdict}`")
    if state.candidates:
        c = state.candidates[-1]
        lines.append(
            f"- repair attempts: {state.budgets.repair_attempts_used}/{state.budgets.repair_attempts_max}"
            f" (last: `{c.verification}`)"
        )
    if state.publish is not None and state.publish.pr_url:
        lines.append(f"- draft PR: {state.publish.pr_url} (commit `{state.publish.commit}`)")
    if state.phase == Phase.AWAITING_REVIEW and state.pending_approval is not None:
        lines.append(f"- awaiting review of head `{state.pending_approval.head_sha}`")
    if state.merged_sha:
        lines.append(f"- merged as `{state.merged_sha}`")
    if state.publish is not None and state.publish.report_url:
        lines.append(f"- evidence report: {state.publish.report_url}")
    elif state.outcome is not None and state.evidence:
        lines.append(
            f"- evidence: {len(state.evidence)} artifact(s) kept in the store (`durafix status --json` lists them)"
        )
    if state.report_edits:
        editors = ", ".join(sorted({e.editor for e in state.report_edits if e.editor})) or "someone"
        fields = " and ".join(sorted({f for e in state.report_edits for f in e.fields})) or "text"
        lines.append(
            f"- the report was edited after the trigger ({fields}, by {editors}); this run uses the report as it"
            " was when it was triggered. To work on the edited report, comment `/durafix retry` once this run ended."
        )
    if note:
        lines.append(f"- note: {note}")
    return "\n".join(lines) + "\n"


def drafting_text(drafting: DraftingFact) -> str:
    """What drafting a reproduction from the report's prose came to, in one line: the accepted draft ("reproduced
    with the test tests/test_x.py, drafted from your report"), or how far the drafts got."""
    accepted = drafting.accepted_round
    tried = len(drafting.rounds)
    if accepted is not None:
        refused = f" after {tried - 1} draft(s) that did not show the bug" if tried > 1 else ""
        return f"reproduced with {accepted.described}, drafted from your report{refused}"
    if drafting.rounds and drafting.rounds[-1].status is None:
        return f"drafting a reproduction from your report: draft {tried} of {drafting.max_rounds} runs on the base"
    if not drafting.rounds:
        return "drafting a reproduction from your report"
    last = drafting.rounds[-1]
    said = f"the last, {last.described}, was `{last.status}` on the base"
    return f"{tried} reproduction(s) drafted from your report; {said}"


def kind_said(state: RunState) -> str:
    """`` (a test reproduction, run in the sandbox)``: how the run reproduced the report, said for a command or
    test reproduction; empty for a browser procedure (its texts are what they were before kinds existed)."""
    kind = state.reproduction_kind
    if kind == ReproductionKind.BROWSER:
        return ""
    if state.reproduction_app:
        return f" (a {kind.value} reproduction, run in the sandbox against the app)"
    return f" (a {kind.value} reproduction, run in the sandbox)"


_TRIAGE_TEXT = {
    TriageReason.ENVIRONMENT_NOT_SET_UP: "the environment could not be set up, so the report was not tried",
    TriageReason.NOT_REPRODUCED: "the report did not reproduce on the base revision",
    TriageReason.INCONCLUSIVE: "the reproduction's runs on the base revision disagreed",
    TriageReason.BASELINE_FAILS: "the recipe's tests already fail on the base revision",
}


def triage_text(reason: TriageReason) -> str:
    """A triage reason in words."""
    return _TRIAGE_TEXT[reason]


def failed_command_text(env: EnvironmentFailureFact) -> str:
    """``setup command `npm ci` exited 1``: the command an environment failed on, and how. No command named: the
    recipe declares none for the stage, said as "durafix.yaml declares no `start`"."""
    if not env.command.strip():
        return f"durafix.yaml declares no `{env.stage}`"
    if env.stage == "start" and env.exit_code is None:
        how = "never became ready"
    else:
        how = "timed out" if env.exit_code is None else f"exited {env.exit_code}"
    return f"{env.stage} command {code_span(env.command)} {how}"


def triage_lines(triage: TriageFact) -> list[str]:
    """The typed reason of a triage ending as the ticket says it, one item a line (:func:`triage_items`)."""
    return [f"{label}: {value}" for label, value in triage_items(triage)]


def triage_items(triage: TriageFact, *, markdown: bool = True) -> list[tuple[str, str]]:
    """The typed reason of a triage ending, as (label, text) items: the reason; for an environment that could not
    be set up, the command it failed on and how, its stored log, and the hint when the cause was recognised. The
    ticket's (``markdown``) link the log by name; ``durafix status``'s (plain) name its key, then the link."""
    reason = triage.reason
    said = f"**{triage_text(reason)}** (`{reason.value}`)" if markdown else f"{reason.value}: {triage_text(reason)}"
    items = [("reason", said)]
    env = triage.environment
    if env is None:
        return items
    items.append(("failed", failed_command_text(env)))
    log = env.log_ref
    if log is not None and markdown:
        name = f"[{log.name}]({env.log_url})" if env.log_url else log.name
        items.append(("log", f"{name} (sha256 `{log.sha256}`)"))
    elif log is not None:
        items.append(("log", f"{log.key} (sha256 {log.sha256})" + (f"  {env.log_url}" if env.log_url else "")))
    if env.hint:
        items.append(("hint", env.hint))
    return items


def code_span(text: str) -> str:
    """``text`` as a Markdown code span on one line, whatever backticks it holds."""
    flat = " ".join(text.split())
    fence = "`" * (max((len(run) for run in re.findall("`+", flat)), default=0) + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") else ""
    return f"{fence}{pad}{flat}{pad}{fence}"


def cleanup_incomplete_note(workflow_id: str, cleanup: CleanupFact) -> str:
    """What a run whose cleanup could not complete says on its ticket: the resources that remain (each as
    ``kind:id``, or that they are unknown when cleanup itself failed) and the command that finishes the job.
    The errors are not quoted (they name paths on the worker's host); ``durafix status`` shows them."""
    if cleanup.remaining:
        left = f"cleanup could not remove {len(cleanup.remaining)} resource(s): " + ", ".join(
            f"`{r}`" for r in cleanup.remaining
        )
    else:
        left = f"cleanup failed, so what remains is unknown (`durafix resources --run '{workflow_id}'` lists it)"
    return (
        f"{left}. To finish: fix the cause (`durafix status '{workflow_id}' --json` names the errors), then run "
        f"`durafix cleanup --run '{workflow_id}' --yes`"
    )


SUBJECT_LIMIT = 72


def subject_line(text: str, limit: int = SUBJECT_LIMIT) -> str:
    """``text`` on one line, at most ``limit`` characters, cut after a whole word; when that would drop
    more than half the limit (one very long word), cut at the limit instead."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    cut = line[: limit + 1].rsplit(" ", 1)[0].rstrip(" :,;-")
    return cut if len(cut) >= limit // 2 else line[:limit]


def commit_message(state: RunState, issue_title: str, summary: str) -> str:
    first = subject_line(f"Fix #{state.issue_number}: {issue_title}")
    return f"{first}\n\n{summary.strip()}\n\nRun: {state.workflow_id}\n"


def pr_title(issue_title: str, issue_number: int) -> str:
    return f"Fix #{issue_number}: {issue_title}"


def pr_body(state: RunState, candidate: CandidateFact, closing_keyword: str = "Fixes") -> str:
    """The draft PR's description; with a ``closing_keyword`` (GitHub's ``Fixes``, ``Closes``, ...) its first
    line closes the report's issue when the PR merges."""
    closes = f"{closing_keyword} #{state.issue_number}\n\n" if closing_keyword else ""
    return (
        closes + f"Automated repair for #{state.issue_number} by durafix (`{state.workflow_id}`).\n\n"
        f"{candidate.summary.strip()}\n\n"
        f"- base revision: `{state.target_revision}`\n"
        f"- candidate commit: `{candidate.commit}` (attempt {candidate.attempt})\n"
        + "".join(
            f"- revision {c.revision} as {c.reviewer or 'a reviewer'} asked: `{c.commit}`: {c.summary.strip()}\n"
            for c in state.candidates
            if c.revision and c.verification == VerificationStatus.PASSED
        )
        + "- evidence: see the evidence comment below; approve by reviewing this head.\n"
    )


def evidence_comment(state: RunState, candidate: CandidateFact, evidence: EvidenceResult) -> str:
    """Links to every stored artifact with its hash, tied to the tested commit."""
    lines = [
        f"### durafix evidence for `{candidate.commit}`",
        "",
        f"- report: {evidence.report_url}",
        f"- evidence bundle digest: `{evidence.digest}` (an approval names this)",
        f"- base revision `{state.target_revision}`{kind_said(state)}: "
        f"`{state.reproduction.status if state.reproduction else 'unknown'}`",
        *([f"- {drafting_text(state.drafting)}"] if state.drafting is not None else []),
        f"- candidate `{candidate.commit}`: tests {'passed' if candidate.tests_passed else 'failed'}, "
        f"replay `{candidate.replay.status if candidate.replay else 'not run'}`",
        "",
        "| artifact | kind | sha256 |",
        "| --- | --- | --- |",
    ]
    for ref in state.evidence:
        link = evidence.links.get(ref.sha256)
        name = f"[{ref.name}]({link})" if link else ref.name
        lines.append(f"| {name} | {ref.kind} | `{ref.sha256}` |")
    return "\n".join(lines) + "\n"
