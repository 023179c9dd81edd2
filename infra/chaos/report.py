"""The soak's report: one table row per run, a summary, and the same as one JSON document.

Columns: the run, its outcome, the counts on the forge (tickets, branches, PRs, merged PRs, evidence
comments), the resume latencies of its activities after faults (how many, median and largest, in seconds:
``p50-s``, ``max-s``),
its workflow tasks that timed out, its leaked resources, and ``ok`` or the first of its problems.
"""

from __future__ import annotations

import statistics
from typing import Any

from infra.chaos.soak import Run, SoakResult

COLUMNS = (
    "run",
    "outcome",
    "tickets",
    "branches",
    "PRs",
    "merged",
    "evidence",
    "resumes",
    "p50_s",
    "max_s",
    "wft-to",
    "leaks",
    "verdict",
)


def _latencies(run: Run) -> list[float]:
    return [r.latency_s for r in run.history.resumes] if run.history else []


def _row(run: Run) -> tuple[str, ...]:
    f = run.forge
    lat = _latencies(run)
    return (
        str(run.index),
        run.outcome,
        *(
            str(n)
            for n in ((f.tickets, f.branches, f.pull_requests, len(f.merged), f.evidence_comments) if f else ("-",) * 5)
        ),
        str(len(lat)),
        f"{statistics.median(lat):.1f}" if lat else "-",
        f"{max(lat):.1f}" if lat else "-",
        str(run.history.workflow_task_timeouts) if run.history else "-",
        str(len(run.leaks)),
        run.problems[0] if run.problems else "ok",
    )


def render(result: SoakResult) -> str:
    """The table and the summary lines, as ``durafix chaos`` prints them."""
    rows = [COLUMNS, *(_row(r) for r in result.runs)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1] for row in rows]
    lines += ["", *summary_lines(result)]
    return "\n".join(lines)


def summary_lines(result: SoakResult) -> list[str]:
    plan = result.plan
    outcomes: dict[str, int] = {}
    for run in result.runs:
        outcomes[run.outcome] = outcomes.get(run.outcome, 0) + 1
    lat = sorted(x for run in result.runs for x in _latencies(run))
    worker_kills = sum(f.kind == "worker" for f in result.faults)
    server = [f for f in result.faults if f.kind == "server"]
    problems = result.problems + [f"run {r.index}: {p}" for r in result.runs for p in r.problems]
    lines = [
        f"seed {plan.seed}: {plan.runs} runs, {plan.workers} workers, kills every {plan.kill_every[0]:g}-"
        f"{plan.kill_every[1]:g}s"
        + (f" for the first {plan.faults_for_s:g}s" if plan.faults_for_s is not None else "")
        + f", {result.wall_s:.0f}s",
        "outcomes " + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())),
        f"faults   {worker_kills} worker kills, {len(server)} server kills"
        + (f" (down {', '.join(f'{f.down_s:.1f}s' for f in server)})" if server else "")
        + (f", {result.skipped_ticks} ticks with no worker polling" if result.skipped_ticks else ""),
        f"resumes  {len(lat)} after a fault"
        + (
            f": p50 {statistics.median(lat):.1f}s, p95 {lat[min(len(lat) - 1, int(0.95 * len(lat)))]:.1f}s, "
            f"max {lat[-1]:.1f}s"
            if lat
            else ""
        ),
        f"leaks    {sum(len(r.leaks) for r in result.runs)} run resources, {len(result.strays)} stray processes"
        + (
            f" ({sum(len(r.held) for r in result.runs)} resources held by lost runs, removed)"
            if any(r.held for r in result.runs)
            else ""
        ),
        "verdict  " + ("PASS" if result.ok else f"FAIL ({len(problems)} problems)"),
    ]
    lines += [f"  - {p}" for p in problems]
    return lines


def as_json(result: SoakResult) -> dict[str, Any]:
    """The report as one JSON-ready document (``STATE/chaos-report.json``)."""
    plan = result.plan
    return {
        "seed": plan.seed,
        "plan": {
            "runs": plan.runs,
            "workers": plan.workers,
            "kill_every": list(plan.kill_every),
            "server_kills": plan.server_kills,
            "faults_for_s": plan.faults_for_s,
            "deadline_s": plan.deadline_s,
            "concurrency": plan.concurrency,
        },
        "ok": result.ok,
        "wall_s": round(result.wall_s, 1),
        "problems": result.problems,
        "strays": result.strays,
        "skipped_ticks": result.skipped_ticks,
        "faults_stopped_s": None if result.faults_stopped_s is None else round(result.faults_stopped_s, 2),
        "faults": [
            {
                "kind": f.kind,
                "at": f.at.isoformat(),
                "elapsed_s": round(f.elapsed_s, 2),
                "pid": f.pid,
                "target": f.target,
                "replacement": f.replacement,
                "down_s": f.down_s,
            }
            for f in result.faults
        ],
        "runs": [_run_json(r) for r in result.runs],
    }


def _run_json(run: Run) -> dict[str, Any]:
    f = run.forge
    return {
        "index": run.index,
        "workflow_id": run.workflow_id,
        "repository": run.repository,
        "issue": run.issue,
        "outcome": run.outcome,
        "detail": run.state.outcome_detail if run.state else "",
        "merged_sha": run.state.merged_sha if run.state else None,
        "started_s": run.started_s,
        "ended_s": run.ended_s,
        "forge": None
        if f is None
        else {
            "tickets": f.tickets,
            "branches": f.branches,
            "pull_requests": f.pull_requests,
            "merged": f.merged,
            "evidence_comments": f.evidence_comments,
            "main_head": f.main_head,
        },
        "resumes": [
            {
                "activity": r.activity,
                "attempt": r.attempt,
                "fault": r.fault,
                "latency_s": round(r.latency_s, 2),
                "failure": r.failure,
            }
            for r in (run.history.resumes if run.history else [])
        ],
        "retries_without_fault": run.history.retries_without_fault if run.history else None,
        "workflow_task_timeouts": run.history.workflow_task_timeouts if run.history else None,
        "leaks": run.leaks,
        "held": run.held,
        "problems": run.problems,
    }
