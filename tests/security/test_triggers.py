"""Who may start a run, and which text it works on, on the real emulator and the real Temporal dev server.

A trigger counts only when its sender holds at least ``trigger_permission`` (``triage``) on the repository,
read from the forge; the run works on the issue text of the trigger's payload, and an edit afterwards is
said on the ticket, never taken in.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus

from browser.procedure import extract_procedure
from infra.cli.demo import issue_text
from pipeline import client as runs
from pipeline.services import Services
from pipeline.state import Phase
from reviews.markers import COMMENT, find_marker
from tests.replay.record import record_history
from tests.support.forge_logins import BOT, MAINTAINER, OUTSIDER, READER, TRIAGER, TRIGGER
from tests.support.security_harness import DECISION_EVENTS, Site, eventually, example, workers
from tests.support.stamps import forge_now

EDITED_PROCEDURE = """```durafix-repro
version: 1
name: something else entirely
steps:
  - action: goto
    path: /admin
bug_present:
  - action: expect_text
    selector: "#secret"
    contains: token
```
"""


def issue_delivery(site: Site, action: str, number: int, sender: str, *, label: str | None = TRIGGER) -> dict[str, Any]:
    """GitHub's example ``issues`` payload for this repository's issue ``number``, sent by ``sender``.

    Used for what the emulator (like GitHub's API) never lets an outsider do but a forge still delivers: an
    issue form puts its labels on whoever opens the issue."""
    payload = copy.deepcopy(example("issues", action))
    payload["repository"] = site.repository_payload()
    issue = site.repo(MAINTAINER).get_issue(number)
    payload["issue"].update(number=number, title=issue.title, body=issue.body, updated_at=forge_now())
    template = payload["issue"]["labels"][0]
    payload["issue"]["labels"] = [{**template, "name": label}] if label else []
    if action == "labeled" and label:
        payload["label"] = {**payload["label"], "name": label}
    payload["sender"]["login"] = sender
    return payload


async def refused_trigger(site: Site, sender: str, action: str) -> dict[str, Any]:
    """``sender`` opens an issue and a delivery of ``action`` with the trigger label comes from them: refused
    (403) with no run started. The receiver's answer."""
    number = site.repo(sender).create_issue(title="Total is wrong", body="see title").number
    status, answer = await site.deliver("issues", issue_delivery(site, action, number, sender))
    assert status == 403, answer
    assert await site.status(site.run_id(number)) is None
    return answer


async def test_an_outsiders_label_starts_no_run(site: Site) -> None:
    answer = await refused_trigger(site, OUTSIDER, "labeled")
    assert (answer["sender"], answer["role"], answer["required"]) == (OUTSIDER, "none", "triage")
    assert "no run was started" in answer["message"]


async def test_an_outsiders_issue_opened_with_the_label_starts_no_run(site: Site) -> None:
    # An issue form applies its labels for anyone: the "opened" event then carries the trigger label.
    answer = await refused_trigger(site, OUTSIDER, "opened")
    assert answer["role"] == "none"


async def test_a_reader_is_below_triage_and_starts_no_run(site: Site) -> None:
    answer = await refused_trigger(site, READER, "labeled")
    assert answer["role"] == "read"


async def test_a_triagers_label_on_an_outsiders_issue_starts_the_run_with_the_text_pinned(site: Site) -> None:
    title, body = issue_text()
    # The real thing: the triager labels through the forge's API, whose delivery reaches the receiver.
    _, workflow_id, delivery = site.labelled_run(TRIAGER, title, body)
    inp = await site.started_input(workflow_id)
    assert inp.report is not None
    assert (inp.report.title, inp.report.body) == (title, body)
    assert (inp.report.author, inp.report.triggered_by) == (OUTSIDER, TRIAGER)
    assert inp.trigger == f"webhook:{delivery['guid']}"


@pytest.mark.slow
async def test_an_edit_after_the_trigger_is_noted_on_the_ticket_and_the_run_uses_the_pinned_text(
    site: Site,
) -> None:
    title, body = issue_text()
    issue, workflow_id, _ = site.labelled_run(MAINTAINER, title, body)
    # The author rewrites the report before any worker read it: its procedure now probes another page.
    site.repo(OUTSIDER).get_issue(issue.number).edit(body=EDITED_PROCEDURE)
    [edited] = site.deliveries("issues", "edited")
    assert edited["status_code"] == 200, edited

    async with workers(site.client, site.config, procedure=True):
        state = await eventually(lambda: _state_at_provision(site, workflow_id), 60, "the run to reach provisioning")
        # The procedure the run stored is the one of the text at the trigger, not the edited one.
        store = Services(site.config).store
        [procedure_ref] = [ref for ref in state.evidence if ref.name.endswith("procedure.json")]
        stored = store.read_bytes(procedure_ref).decode()
        pinned = extract_procedure(body)
        assert pinned is not None and pinned.name in stored and "/admin" not in stored
        assert {e.source.split(":")[0] for e in state.report_edits} == {"intake", "webhook"}

        def ticket_text() -> str | None:
            assert state.ticket is not None and state.ticket.comment_id is not None
            text = site.repo(MAINTAINER).get_issue(issue.number).get_comment(state.ticket.comment_id).body
            return text if "edited after the trigger" in text else None

        ticket = await eventually(ticket_text, 30, "the ticket to note the edit")
        assert f"by {OUTSIDER}" in ticket and "uses the report as it was when it was triggered" in ticket

        # An edit once the ticket exists is said on it when the signal arrives, not at the next phase.
        site.repo(OUTSIDER).get_issue(issue.number).edit(title="Something else")
        await eventually(
            lambda: "(body and title, by outsider)" in (ticket_text() or ""), 30, "the ticket to note the title edit"
        )
    # The edit signals are the only messages the run received: an edit is no decision.
    signals = await site.events(workflow_id, *DECISION_EVENTS)
    assert [s.event_type for s in signals] == [EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED] * 2
    assert {s.workflow_execution_signaled_event_attributes.signal_name for s in signals} == {"report_edited"}
    # The pinned report, an edit seen at intake and two edit signals: replayed by tests/replay.
    record_history(await site.client.get_workflow_handle(workflow_id).fetch_history(), "report-edited-after-trigger")


async def _state_at_provision(site: Site, workflow_id: str) -> Any:
    try:
        state = await runs.get_state(site.client, workflow_id)
    except Exception:
        return None
    return state if state.phase == Phase.PROVISION and state.ticket is not None else None


async def test_relabelling_an_issue_whose_run_ended_starts_its_next_run_once(site: Site) -> None:
    triager, workflow_id, _ = await site.ended_labelled_run()

    # Removing the label of an ended run cancels nothing; adding it again is a retry: run 2, its own ID.
    triager.remove_from_labels(TRIGGER)
    [unlabelled] = site.deliveries("issues", "unlabeled")
    assert unlabelled["status_code"] == 202, unlabelled
    triager.add_to_labels(TRIGGER)
    retry_id = f"{workflow_id}~2"
    site.touched.add(retry_id)
    relabel = site.deliveries("issues", "labeled")[1]
    assert relabel["status_code"] == 202, relabel
    assert await site.status(retry_id) == WorkflowExecutionStatus.RUNNING
    assert (await site.started_input(retry_id)).trigger == f"webhook:{relabel['guid']}"
    assert (await site.started_input(retry_id)).report is not None

    # Another trigger while run 2 is live attaches to it; the issue was told of the new run once.
    status, again = await site.deliver("issues", issue_delivery(site, "labeled", triager.number, TRIAGER))
    assert status == 202 and again["workflow_id"] == retry_id and again["attached"] is True, again
    answers = retry_comments(site, triager.number, retry_id)
    assert len(answers) == 1, answers
    assert f"`{retry_id}`" in answers[0] and f"`{workflow_id}` ended" in answers[0]
    assert await site.status(f"{workflow_id}~3") is None
    # An outsider's re-label is refused before anything is said on the issue or started.
    status, _ = await site.deliver("issues", issue_delivery(site, "labeled", triager.number, OUTSIDER))
    assert status == 403
    assert len(retry_comments(site, triager.number, retry_id)) == 1


def retry_comments(site: Site, number: int, workflow_id: str) -> list[str]:
    """The bot's comments on the issue keyed as the announcement of run ``workflow_id``."""
    found = []
    for comment in site.repo(MAINTAINER).get_issue(number).get_comments():
        marker = find_marker(comment.body, COMMENT)
        if comment.user.login == BOT and marker and marker.attrs.get("key") == f"{workflow_id}:retry":
            found.append(comment.body)
    return found
