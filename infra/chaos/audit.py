"""What a soak's runs left behind, read from outside the runs: the forge, the workflow histories, the disk.

- Forge: every object is counted on the emulator over its REST API by the markers and branch names a run
  puts on what it creates (:mod:`reviews.markers`), never from the run's own state: tickets (comments on the
  report, or issues, marked ``durafix:ticket op=<run>:...``), branches under ``durafix/<run>/``, pull requests
  marked ``durafix:pr run=<run>``, evidence comments keyed ``<run>:evidence...`` on the report and the PRs.
- Histories: the start of every activity attempt after the first is matched with the last fault injected
  between the activity's scheduling and that start; the gap is the resume latency. Temporal records only the
  last attempt's start (with the failure of the one before), so an activity killed twice shows its last
  resume only.
- Disk: what the holders of the stack's state directory (local processes, workspaces; see
  :mod:`environments.inventory`) still list for the run, and live processes carrying the run's ownership
  marker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from github.Repository import Repository
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.api.failure.v1 import Failure
from temporalio.client import Client

from environments.files import path_key
from environments.inventory import open_holders, take_inventory
from environments.processes import owned_pids
from infra.chaos.faults import Fault
from infra.forge.testing import client as forge_client
from pipeline.config import DurafixConfig
from reviews.markers import COMMENT, PULL, TICKET, parse_markers, run_branch_prefix


@dataclass
class ForgeCount:
    """The run's objects on the forge; ``merged`` holds the merge commits of its merged PRs."""

    tickets: int = 0
    branches: int = 0
    pull_requests: int = 0
    evidence_comments: int = 0
    merged: list[str] = field(default_factory=list)
    main_head: str = ""


def _marked(body: str | None, kind: str, attr: str, prefix: str) -> bool:
    return any(m.kind == kind and m.attrs.get(attr, "").startswith(prefix) for m in parse_markers(body))


def count_on_forge(config: DurafixConfig, repository: str, issue_number: int, run_id: str) -> ForgeCount:
    """Count what ``run_id`` left in ``repository`` (see the module docstring for what is counted how)."""
    gh = forge_client(config.forge_api_url, config.forge_token)
    repo: Repository = gh.get_repo(repository)
    ops, evidence_key = f"{run_id}:", f"{run_id}:evidence"
    count = ForgeCount()
    report = repo.get_issue(issue_number)
    comments = list(report.get_comments())
    count.tickets += sum(_marked(c.body, TICKET, "op", ops) for c in comments)
    count.evidence_comments += sum(_marked(c.body, COMMENT, "key", evidence_key) for c in comments)
    for issue in repo.get_issues(state="all"):
        if issue.number != issue_number and issue.pull_request is None and _marked(issue.body, TICKET, "op", ops):
            count.tickets += 1
    prefix = run_branch_prefix(run_id)
    count.branches = sum(b.name.startswith(prefix) for b in repo.get_branches())
    for pr in repo.get_pulls(state="all"):
        if not (_marked(pr.body, PULL, "run", run_id) or pr.head.ref.startswith(prefix)):
            continue
        count.pull_requests += 1
        if pr.merged:
            count.merged.append(pr.merge_commit_sha)
        pr_comments = repo.get_issue(pr.number).get_comments()
        count.evidence_comments += sum(_marked(c.body, COMMENT, "key", evidence_key) for c in pr_comments)
    count.main_head = repo.get_branch(repo.default_branch).commit.sha
    return count


@dataclass(frozen=True)
class Resume:
    """An activity attempt started again after a fault: ``latency_s`` from the fault to that start."""

    activity: str
    attempt: int
    fault: str
    latency_s: float
    failure: str


@dataclass
class HistoryFacts:
    resumes: list[Resume] = field(default_factory=list)
    retries_without_fault: int = 0
    workflow_task_timeouts: int = 0


def _fault_before(faults: Sequence[Fault], after: datetime, before: datetime) -> Fault | None:
    inside = [f for f in faults if after <= f.at <= before]
    return max(inside, key=lambda f: f.at) if inside else None


def _failure_text(failure: Failure) -> str:
    if failure.HasField("timeout_failure_info"):
        kind = TimeoutType.Name(failure.timeout_failure_info.timeout_type).removeprefix("TIMEOUT_TYPE_").lower()
        return f"{kind} timeout: {failure.message}"
    return failure.message


async def read_history(client: Client, workflow_id: str, faults: Sequence[Fault]) -> HistoryFacts:
    """Resume latencies and workflow-task timeouts from the run's history (see the module docstring)."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    facts = HistoryFacts()
    scheduled: dict[int, tuple[str, datetime]] = {}
    for event in history.events:
        when = event.event_time.ToDatetime(tzinfo=UTC)
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            scheduled[event.event_id] = (attrs.activity_type.name, when)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = event.activity_task_started_event_attributes
            if started.attempt <= 1:
                continue
            name, at = scheduled.get(started.scheduled_event_id, ("?", when))
            fault = _fault_before(faults, at, when)
            if fault is None:
                facts.retries_without_fault += 1
                continue
            facts.resumes.append(
                Resume(
                    activity=name,
                    attempt=started.attempt,
                    fault=fault.kind,
                    latency_s=(when - fault.at).total_seconds(),
                    failure=_failure_text(started.last_failure),
                )
            )
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            facts.workflow_task_timeouts += 1
    return facts


def leaked_resources(config: DurafixConfig, run_id: str) -> list[str]:
    """What the run still owns on this host: holder records (environments, processes, workspaces) and live
    marked processes, one description each. A holder that cannot be listed is a leak too (unknown is not
    "nothing")."""
    holders, unopened = open_holders(
        config.state_dir, environment_provider=config.environment_provider, docker_host=config.docker_host
    )
    inventory = take_inventory(holders, unopened, run_id)
    leaks = [f"{r.provider} {r.kind} {r.resource_id}" for r in inventory.resources]
    leaks += [f"unlisted holder {u.name}: {u.reason}" for u in inventory.unavailable]
    leaks += [f"process {pid}" for pid in sorted(owned_pids(f"{path_key(run_id)}/", prefix=True))]
    return leaks
