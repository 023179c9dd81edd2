"""Benchmark: from the ``issues.labeled`` webhook to the draft PR on the forge, for the sample app.

Run: ``uv run python -m tests.bench.bench_webhook_pr [--runs N] [--quick]`` (default N=3; ``--quick``
is one). On the embedded e2e stack (:func:`tests.support.e2e_stack.running_e2e_stack`: the GitHub emulator, the
scripted model server, the evidence server, a real Temporal dev server, the webhook receiver) with one
``durafix worker`` process, each run:

1. seeds a fresh repository with the sample app (``examples/cart``) and opens its report without the trigger
   label (the receiver ignores it);
2. adds the label through the forge's API: the clock starts. The forge POSTs the signed ``issues.labeled``
   delivery (``X-Hub-Signature-256``) to the receiver, which starts ``repair_bug``;
3. polls the forge (every 0.1 s) for a draft PR from the run's branch: the clock stops when it is visible.

Phases, where the records make them easy to read: the forge's delivery record (when it sent the delivery and
how long the receiver took to answer), the run's history (its start, and the completion of the steps that
end each stage: ticket, base reproduction, baseline, repair, verification, the PR), and the poll. Each
run is then cancelled (its cleanup awaited) before the next one starts. One unmeasured run first warms the
worker (imports, the browser, the mirror and dependency caches). Medians over the runs.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client

from pipeline import client as runs
from pipeline import steps
from pipeline.flow.attempt_carry import ATTEMPT_WORKFLOW
from pipeline.ids import branch_for, workflow_id_for
from tests.bench.bench_tax import e2e_stack
from tests.bench.report import counted
from tests.support.e2e_stack import E2EStack
from tests.support.run_history import cancel_and_wait, completions

DEFAULT_RUNS = 3
POLL_S = 0.1
TIMEOUT_S = 1200.0  # a loaded two-core host has taken over 10 minutes to reach the PR

# The step whose completion ends each stage of a run up to its PR (the stage's name, the step, which one).
MILESTONES: list[tuple[str, str, int]] = [
    ("ticket posted", steps.ENSURE_TICKET.name, 1),
    ("base reproduced", steps.REPRODUCE.name, 1),
    ("baseline tests", steps.RUN_BASELINE.name, 1),
    # A repair attempt runs as a child workflow: its model steps are in its own history, its end in the run's.
    ("repair (model steps)", ATTEMPT_WORKFLOW, 1),
    ("verified (tests, replay)", steps.REPRODUCE.name, 2),
    ("evidence built", steps.BUILD_EVIDENCE.name, 1),
    ("branch pushed", steps.PUBLISH_BRANCH.name, 1),
    ("draft PR opened", steps.ENSURE_DRAFT_PR.name, 1),
]


@dataclass
class Measured:
    """One run: seconds from the label to the draft PR seen on the forge, and its phases (seconds each)."""

    workflow_id: str
    total_s: float
    phases: dict[str, float] = field(default_factory=dict)
    receiver_s: float = 0.0  # the receiver's answer to the forge's POST (the forge's record of the delivery)
    draft: bool = False


class WebhookToPr:
    def __init__(self, stack: E2EStack, client: Client) -> None:
        self.stack = stack
        self.client = client

    def labeled_delivery(self, repository: str, issue: int) -> dict[str, Any]:
        """The forge's record of the ``issues.labeled`` delivery for ``issue`` (sent and answered)."""
        owner = self.stack.github(self.stack.owner_token())
        requester = owner.requester
        (hook,) = list(owner.get_repo(repository).get_hooks())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            _, listed = requester.requestJsonAndCheck("GET", f"{hook.url}/deliveries?per_page=100")
            for row in listed:
                if row["event"] != "issues" or row["action"] != "labeled" or row["status"] == "pending":
                    continue
                _, full = requester.requestJsonAndCheck("GET", f"{hook.url}/deliveries/{row['id']}")
                if full["request"]["payload"]["issue"]["number"] == issue:
                    return dict(full)
            time.sleep(0.2)
        raise TimeoutError(f"no issues.labeled delivery recorded for #{issue} in {repository}")

    async def one(self) -> Measured:
        stack = self.stack
        repository = stack.new_repository()
        issue = stack.open_report(repository, labelled=False)
        workflow_id = workflow_id_for(repository, issue)
        branch = branch_for(workflow_id)
        repo = stack.github().get_repo(repository)
        gh_issue = repo.get_issue(issue)
        await asyncio.sleep(1)  # the "opened" delivery (ignored) is not what is timed

        wall0 = time.time()
        started = time.monotonic()
        gh_issue.add_to_labels(stack.config.trigger_label)
        draft = False
        while True:
            pulls = await asyncio.to_thread(lambda: [p for p in repo.get_pulls(state="open") if p.head.ref == branch])
            if pulls:
                draft = bool(pulls[0].draft)
                break
            if time.monotonic() - started > TIMEOUT_S:
                raise TimeoutError(f"no PR from {branch} within {TIMEOUT_S:.0f}s; receiver: {stack.deliveries_log()}")
            await asyncio.sleep(POLL_S)
        total = time.monotonic() - started
        seen = wall0 + total

        # The forge records when it finished a delivery to the second only, but its duration to the millisecond.
        delivery = await asyncio.to_thread(self.labeled_delivery, repository, issue)
        history = await completions(self.client, workflow_id)
        done = history.done
        marks: list[tuple[str, float]] = [("label -> run started (forge POST, receiver)", history.started)]
        # In the order they were reached: checks that run side by side (the base reproduction and the baseline)
        # may end in either order, and each stage is the time since the one reached before it.
        marks += sorted(
            ((stage, done[(name, k)]) for stage, name, k in MILESTONES if (name, k) in done), key=lambda m: m[1]
        )
        # The forge shows the PR as soon as it answered the draft PR's step, which the server records a moment
        # later: a poll that saw it first saw it when that step ended, not before.
        marks.append(("PR seen on the forge (poll)", max(seen, marks[-1][1])))
        phases: dict[str, float] = {}
        before = wall0
        for stage, at in marks:
            phases[stage] = at - before
            before = at

        await cancel_and_wait(self.client, workflow_id, 120)
        return Measured(
            workflow_id=workflow_id, total_s=total, phases=phases, receiver_s=float(delivery["duration"]), draft=draft
        )


def bench(n: int, *, warm: bool = True) -> list[Measured]:
    """``n`` measured runs (see the module) on one fresh e2e stack with one worker process. Synchronous: the
    stack starts and stops outside any event loop."""
    with tempfile.TemporaryDirectory(prefix="durafix-bench-webhook-") as tmp, e2e_stack(Path(tmp)) as stack:
        stack.spawn_worker()
        return asyncio.run(on_stack(stack, n, warm=warm))


async def on_stack(stack: E2EStack, n: int, *, warm: bool) -> list[Measured]:
    bench = WebhookToPr(stack, await runs.connect(stack.config))
    if warm:
        print("warming up: one run (not measured)", file=sys.stderr, flush=True)
        await bench.one()
    out = []
    for i in range(n):
        m = await bench.one()
        print(f"  run {i + 1}: {m.total_s:.1f}s", file=sys.stderr, flush=True)
        out.append(m)
    return out


def report(results: list[Measured], command: str) -> None:
    total = statistics.median(m.total_s for m in results)
    print(f"$ {command}")
    print(
        "the sample app's report labelled on the forge -> signed issues.labeled delivery -> receiver -> repair_bug "
        f"-> draft PR seen on the forge; medians of {len(results)} run(s)"
    )
    stages = list(results[0].phases)
    rows = [(f"  {stage}", statistics.median(m.phases.get(stage, 0.0) for m in results)) for stage in stages]
    receiver = ("    of which the receiver answering the POST", statistics.median(m.receiver_s for m in results))
    width = max(len(label) for label, _ in [*rows, receiver])
    print(f"{'label added -> draft PR visible':<{width}}  {total:7.2f} s")
    for i, (label, seconds) in enumerate(rows):
        print(f"{label:<{width}}  {seconds:7.2f} s  ({seconds / total:5.1%})")
        if i == 0:
            print(f"{receiver[0]:<{width}}  {receiver[1]:7.2f} s  (the forge's record of the delivery)")
    print(f"draft PRs: {sum(m.draft for m in results)} of {len(results)}")


def main() -> None:
    n = counted(__doc__, "--runs", DEFAULT_RUNS, "measured runs")
    report(bench(n), f"python -m tests.bench.bench_webhook_pr --runs {n}")


if __name__ == "__main__":
    main()
