"""What the workflow keeps of a command or test reproduction: the kind ``browser.prepare_procedure`` answers (a
browser procedure stored byte for byte as before kinds existed), the run's typed kind (a state recorded before
kinds is a browser run's), what ``env.reproduce_in_sandbox`` stores and answers (names, redaction, the record as
the log), and how the ticket and the repair agent are told of it."""

from __future__ import annotations

import json
from pathlib import Path

from browser.procedure import extract_procedure
from browser.results import AssertionOutcome, ReproductionStatus
from environments.command_repro import CommandRunRecord, SandboxReproduction, StepRecord
from environments.redaction import Redactor
from environments.reproduction import ReproductionKind, extract_reproduction, to_yaml
from evidence.interface import ArtifactKind
from evidence.local import LocalArtifactStore
from pipeline import messages
from pipeline.activities.browser import BrowserActivities
from pipeline.activities.sandbox_repro import store_reproduction
from pipeline.state import ReproductionFact, ReproductionOutcome, RunState
from pipeline.steps import PrepareProcedureInput
from repair.context import RepairContext, sandbox_reproduction_context
from repair.interface import RepairRequest
from repair.prompts import system_prompt
from repair.stepping import opening_messages
from tests.integration.workflow.test_workflow_logic import ref
from tests.unit.pipeline.test_messages import state

BROWSER = """Steps:

```durafix-repro
version: 1
name: cart total
steps:
  - {action: goto, path: /}
bug_present:
  - {action: expect_text, selector: "#total", not_equals: "$40.00"}
```
"""
COMMAND = """```durafix-repro
version: 1
kind: command
name: median of an even count
steps:
  - run: python3 -c "from statkit import median; print(median([1, 2, 3, 4]))"
bug_present:
  - {check: stdout, not_equals: "2.5"}
```
"""
SECRET = "s3cr3t-token-value"


def prepared(tmp_path: Path, body: str) -> tuple[str, bytes]:
    store = LocalArtifactStore(tmp_path / "store")
    activities = BrowserActivities(store, browser=lambda: (_ for _ in ()).throw(AssertionError("no browser")))
    result = activities.prepare_procedure(PrepareProcedureInput(run_id="repair:acme/lib#1", report_body=body))
    assert result.procedure_ref is not None and result.error is None
    return result.kind, store.read_bytes(result.procedure_ref)


def test_a_browser_procedure_is_stored_as_before_kinds_and_a_command_one_with_its_kind(tmp_path: Path) -> None:
    kind, stored = prepared(tmp_path / "a", BROWSER)
    procedure = extract_procedure(BROWSER)
    assert procedure is not None
    assert (kind, stored) == ("browser", procedure.model_dump_json(indent=2).encode())

    kind, stored = prepared(tmp_path / "b", COMMAND)
    assert kind == "command" and json.loads(stored)["kind"] == "command"


def test_a_state_recorded_before_kinds_is_a_browser_run_and_the_kind_survives_a_round_trip() -> None:
    recorded = state().model_dump(mode="json")
    del recorded["reproduction_kind"]
    assert RunState.model_validate(recorded).reproduction_kind == ReproductionKind.BROWSER
    carried = state(reproduction_kind=ReproductionKind.TEST).model_dump_json()
    assert RunState.model_validate_json(carried).reproduction_kind == ReproductionKind.TEST


def found(stdout: str) -> SandboxReproduction:
    check = AssertionOutcome(index=0, description="stdout not_equals '2.5'", holds=True, actual=stdout)
    step = StepRecord(command="python3 show.py", exit_code=0, stdout=stdout, stderr=f"token={SECRET}\n")
    return SandboxReproduction(
        kind=ReproductionKind.COMMAND,
        name="median",
        status=ReproductionStatus.REPRODUCED,
        detail=f"all 1 runs showed the bug ({SECRET})",
        runs=[CommandRunRecord(run=1, steps=[step], checks=[check], bug_present=True)],
    )


def test_the_record_and_each_runs_log_are_stored_redacted_under_the_ops_label(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "reproduction-run-1.log").write_text(f"$ python3 show.py\n{SECRET}\n")
    redactor = Redactor({"TOKEN": SECRET})
    result = store_reproduction(
        store,
        found('quoted "3" \\ 3\n'),
        logs,
        run_id="repair:acme/lib#1",
        op_id="repair:acme/lib#1:reproduce-base:1",
        revision="a" * 40,
        redactor=redactor,
    )
    assert result.status == ReproductionStatus.REPRODUCED and result.runs == 1
    assert SECRET not in result.detail
    assert result.log_ref is not None and result.log_ref.name == "reproduce-base-reproduction.json"
    assert [r.name for r in result.artifacts] == ["reproduce-base-reproduction-run-1.log", result.log_ref.name]
    assert all(r.kind == ArtifactKind.LOG and r.revision == "a" * 40 for r in result.artifacts)
    assert result.trace_refs == [] and result.screenshot_refs == []
    for stored in result.artifacts:
        assert SECRET not in store.read_bytes(stored).decode()
    record = SandboxReproduction.model_validate_json(store.read_bytes(result.log_ref))
    assert record.runs[0].steps[0].stdout == 'quoted "3" \\ 3\n'  # JSON escapes survive the redaction
    assert record.runs[0].steps[0].stderr.startswith("token=") and SECRET not in record.runs[0].steps[0].stderr


def test_the_ticket_names_a_command_or_test_reproduction_and_a_browser_ones_text_is_unchanged() -> None:
    fact = ReproductionFact(
        op_id="o", revision="a" * 40, status=ReproductionOutcome.REPRODUCED, procedure_ref=ref("procedure.json")
    )
    browser = messages.ticket_body(state(reproduction=fact))
    assert "- reproduction on base: `reproduced`" in browser
    test = messages.ticket_body(state(reproduction=fact, reproduction_kind=ReproductionKind.TEST))
    assert "- reproduction on base (a test reproduction, run in the sandbox): `reproduced`" in test


def test_the_repair_agent_is_told_the_reproductions_yaml_its_checks_and_its_last_command() -> None:
    reproduction = extract_reproduction(COMMAND)
    assert reproduction is not None
    record = json.loads(found("3\n").model_dump_json())
    context = sandbox_reproduction_context(
        revision="b" * 40,
        status="reproduced",
        kind="command",
        procedure_yaml=to_yaml(reproduction),
        record=record,
        redact=Redactor({"TOKEN": SECRET}).text,
    )
    text = RepairContext(reproduction=context).render()
    assert "It is a command reproduction" in text
    assert "```yaml\nversion: 1\nkind: command\n" in text and "median([1, 2, 3, 4])" in text
    assert "- check 1: expected while the bug is present: stdout not_equals '2.5'" in text
    assert 'observed "3\\n": held (run 1)' in text
    assert 'Run 1, last command "python3 show.py": exit 0' in text
    assert SECRET not in text

    unreadable = sandbox_reproduction_context(
        revision="b" * 40, status="reproduced", kind="test", procedure_yaml=None, record="not json", redact=str
    )
    said = RepairContext(reproduction=unreadable).render()
    assert "It is a test reproduction" in said
    assert "the stored reproduction could not be read; the reproduction's record could not be read" in said


def test_the_system_prompt_says_where_a_command_reproduction_runs_and_a_browser_ones_is_unchanged() -> None:
    request = RepairRequest(
        run_id="r", op_id="o", attempt=1, issue_title="t", issue_body="b", workspace="", token_budget=100
    )
    context = sandbox_reproduction_context(
        revision="b" * 40, status="reproduced", kind="command", procedure_yaml="", record={"runs": []}, redact=str
    )
    tools = ["run_tests", "run_reproduction"]
    [system, _] = opening_messages(request, RepairContext(reproduction=context), tools=tools)
    assert "run_reproduction replays the bug report's reproduction (commands or tests)" in system["content"]
    assert "browser" not in system["content"]
    [browser, _] = opening_messages(request, None, tools=tools)
    assert browser["content"] == system_prompt(request, runs=tools)
    assert "in a browser against your workspace's app" in browser["content"]


def test_a_command_reproduction_against_the_app_is_said_to_run_against_it() -> None:
    """The ticket and the repair agent are told that a command reproduction with ``app: true`` ran against the
    running app (where ``$DURAFIX_APP_URL`` reaches it), not in a sandbox with no app."""
    fact = ReproductionFact(
        op_id="o", revision="a" * 40, status=ReproductionOutcome.REPRODUCED, procedure_ref=ref("procedure.json")
    )
    ticket = messages.ticket_body(
        state(reproduction=fact, reproduction_kind=ReproductionKind.COMMAND, reproduction_app=True)
    )
    assert "- reproduction on base (a command reproduction, run in the sandbox against the app): `reproduced`" in ticket
    context = sandbox_reproduction_context(
        revision="b" * 40,
        status="reproduced",
        kind="command",
        procedure_yaml="version: 1\nkind: command\napp: true\n",
        record={"runs": []},
        redact=str,
        app=True,
    )
    text = RepairContext(reproduction=context).render()
    assert "It is a command reproduction against the running app" in text and "$DURAFIX_APP_URL" in text
    assert "no app" not in text
