"""The ``durafix`` command line.

Exit codes: 0 success, 1 a run or command failed, 2 usage error, 3 the run or service was not found.
Processes end with a flush and ``os._exit`` (a short-lived Temporal client can crash at interpreter exit).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from pipeline import client as runs
from pipeline.config import DurafixConfig, load_config
from pipeline.state import Approval, Rejection, RunState

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_NOT_FOUND = 0, 1, 2, 3


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAIL) -> None:
        super().__init__(message)
        self.code = code


def run_ref(text: str) -> str:
    """Accept ``repair:OWNER/REPO#N`` or ``OWNER/REPO#N``."""
    return text if text.startswith("repair:") else f"repair:{text}"


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))


def _state_summary(state: RunState, status: WorkflowExecutionStatus | None) -> str:
    lines = [
        f"run        {state.workflow_id}  (run {state.run_id[:8]}, workflow v{state.workflow_version})",
        f"status     {status.name.lower() if status else 'unknown'}; phase {state.phase.value}"
        + (f"; outcome {state.outcome.value}" if state.outcome else ""),
    ]
    if state.outcome_detail:
        lines.append(f"detail     {state.outcome_detail}")
    if state.target_revision:
        lines.append(f"base       {state.target_revision}")
    if state.ticket:
        lines.append(f"ticket     {state.ticket.url}  (op {state.ticket.op_id})")
    if state.environment:
        env = state.environment
        lines.append(f"env        {env.provider}:{env.env_id} at {env.base_url} [{env.last_status}]")
    if state.reproduction:
        lines.append(f"reproduce  {state.reproduction.status} on {state.reproduction.revision[:12]}")
    for c in state.candidates:
        lines.append(
            f"attempt {c.attempt}  {c.verification}; commit {c.commit or '-'}" + (f"; {c.failure}" if c.failure else "")
        )
    if state.publish:
        p = state.publish
        lines.append(f"publish    {p.branch} @ {p.commit[:12]}; PR {p.pr_url or '-'}")
        if p.evidence_digest:
            lines.append(f"evidence   bundle {p.evidence_digest}")
    if state.pending_approval:
        a = state.pending_approval
        lines.append(f"awaiting   approval of PR #{a.pr_number} head {a.head_sha}")
    if state.approval:
        until = f" until {state.approval.expires_at.isoformat()}" if state.approval.expires_at else ""
        lines.append(f"approved   {state.approval.head_sha[:12]} by {state.approval.reviewer}{until}")
    if state.merged_sha:
        lines.append(f"merged     {state.merged_sha}")
    b = state.budgets
    lines.append(
        f"budgets    repair {b.repair_attempts_used}/{b.repair_attempts_max}; "
        f"tokens {b.model_prompt_tokens + b.model_completion_tokens}/{b.model_token_budget}"
    )
    if state.cleanup:
        lines.append(
            f"cleanup    {'complete' if state.cleanup.complete else 'INCOMPLETE'}; removed {state.cleanup.removed}"
            + (f"; remaining {state.cleanup.remaining}" if state.cleanup.remaining else "")
        )
    if state.cancellation:
        lines.append("cancel     " + " -> ".join(m.step.value for m in state.cancellation))
    lines.append(f"artifacts  {len(state.evidence)} stored (sha256-addressed)")
    if status == WorkflowExecutionStatus.TERMINATED:
        lines.append(
            "WARNING    the run was terminated: its own cleanup did not run and the state above is as of the\n"
            f"           termination. Check `durafix resources --run {state.workflow_id}` and clean up with\n"
            f"           `durafix cleanup --run {state.workflow_id}`; check the forge for a half-finished step."
        )
    return "\n".join(lines)


async def _with_client(config: DurafixConfig, fn: Callable[[Client], Awaitable[int]]) -> int:
    try:
        client = await runs.connect(config)
    except RuntimeError as err:
        raise CliError(
            f"cannot reach Temporal at {config.temporal_address}: {err}\n"
            "start the local stack with `durafix dev up` or set DURAFIX_TEMPORAL_ADDRESS"
        ) from err
    try:
        return await fn(client)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise CliError(f"not found: {err.message}", EXIT_NOT_FOUND) from err
        raise CliError(f"workflow engine error: {err.message}") from err


# ---- commands -------------------------------------------------------------------------------------------


def cmd_dev(args: argparse.Namespace, config: DurafixConfig) -> int:
    from infra import stack

    if args.action == "up":
        cfg = stack.up(
            config.state_dir,
            model_script=Path(args.model_script) if args.model_script else None,
            evidence=args.evidence,
            environments=args.env,
        )
        info = stack.status(cfg.state_dir)
        if args.json:
            _print_json(info)
        else:
            for name, svc in info.items():
                print(f"{name:9} {svc['url']}" + (f"  (ui {svc['ui']})" if "ui" in svc else ""))
            print(f"state     {cfg.state_dir}")
        return EXIT_OK
    if args.action == "status":
        info = stack.status(config.state_dir)
        if args.json:
            _print_json(info)
        elif not info:
            print("no stack recorded in", config.state_dir)
        else:
            for name, svc in info.items():
                print(f"{name:9} {'up  ' if svc['alive'] else 'DOWN'} pid {svc['pid']:<7} {svc['url']}")
        return EXIT_OK if info and all(s["alive"] for s in info.values()) else EXIT_FAIL
    stuck = stack.down(config.state_dir)
    if stuck:
        raise CliError(f"could not stop: {', '.join(stuck)}")
    return EXIT_OK


def cmd_worker(args: argparse.Namespace, config: DurafixConfig) -> int:
    from browser.video import VideoUnavailable
    from pipeline.worker import parse_queues, run_worker

    try:
        queues = parse_queues(args.queues)
    except ValueError as err:
        raise CliError(str(err), EXIT_USAGE) from err
    try:
        asyncio.run(run_worker(config, queues))
    except VideoUnavailable as err:
        raise CliError(f"browser_video is on but {err}", EXIT_USAGE) from err
    return EXIT_OK


def cmd_serve(args: argparse.Namespace, config: DurafixConfig) -> int:
    from pipeline.webhooks import WebhookReceiver

    if not config.webhook_secret:
        raise CliError("no webhook secret configured (DURAFIX_WEBHOOK_SECRET or `durafix dev up`)", EXIT_USAGE)
    receiver = WebhookReceiver(config, args.host, args.port)
    print(f"durafix webhook receiver on {receiver.url}", file=sys.stderr, flush=True)
    try:
        receiver.serve_forever()
    except KeyboardInterrupt:
        print("durafix webhook receiver stopping", file=sys.stderr, flush=True)
    finally:
        receiver.stop()
    return EXIT_OK


def cmd_start(args: argparse.Namespace, config: DurafixConfig) -> int:
    issue = args.issue
    if args.report:
        from reviews.issues import open_issue_from_file

        issue = open_issue_from_file(config, args.repo, Path(args.report), label=config.trigger_label)
        print(f"opened issue #{issue} from {args.report}", file=sys.stderr)
    if issue is None:
        raise CliError("give --issue N or --report FILE", EXIT_USAGE)

    async def go(client: Client) -> int:
        try:
            started = await runs.start_run(client, config, args.repo, issue, base_branch=args.base)
        except runs.RunAlreadyEnded as ended:
            raise CliError(str(ended)) from ended
        if args.json:
            _print_json({"workflow_id": started.workflow_id, "run_id": started.run_id, "attached": started.attached})
        else:
            verb = "attached to running" if started.attached else "started"
            print(f"{verb} {started.workflow_id} (run {started.run_id})")
        if args.wait:
            return await _watch(client, started.workflow_id, args.json)
        return EXIT_OK

    return asyncio.run(_with_client(config, go))


async def _watch(client: Client, workflow_id: str, as_json: bool, until_review: bool = False) -> int:
    """Show phase changes until the run ends; progress goes to stderr so stdout stays scriptable."""
    last = ""
    started = time.monotonic()
    while True:
        status = await runs.status_of(client, workflow_id)
        state = await runs.get_state(client, workflow_id)
        line = state.phase.value + (f" -> {state.outcome.value}" if state.outcome else "")
        if line != last:
            print(f"[{time.monotonic() - started:6.1f}s] {workflow_id}: {line}", file=sys.stderr, flush=True)
            last = line
        if status != WorkflowExecutionStatus.RUNNING or (until_review and state.pending_approval):
            break
        await asyncio.sleep(1)
    if as_json:
        _print_json(state.model_dump(mode="json"))
    else:
        print(_state_summary(state, status))
    return EXIT_OK if state.outcome is not None or until_review else EXIT_FAIL


def cmd_status(args: argparse.Namespace, config: DurafixConfig) -> int:
    workflow_id = run_ref(args.run)

    async def go(client: Client) -> int:
        if args.watch:
            return await _watch(client, workflow_id, args.json)
        status = await runs.status_of(client, workflow_id)
        state = await runs.get_state(client, workflow_id)
        if args.json:
            _print_json({"status": status.name.lower() if status else None, **state.model_dump(mode="json")})
        else:
            print(_state_summary(state, status))
        return EXIT_OK

    return asyncio.run(_with_client(config, go))


def cmd_list(args: argparse.Namespace, config: DurafixConfig) -> int:
    async def go(client: Client) -> int:
        rows = []
        async for wf in client.list_workflows("WorkflowType = 'repair_bug'"):
            rows.append(
                {
                    "workflow_id": wf.id,
                    "run_id": wf.run_id,
                    "status": wf.status.name.lower() if wf.status else None,
                    "started": wf.start_time.isoformat(),
                    "closed": wf.close_time.isoformat() if wf.close_time else None,
                }
            )
        if args.json:
            _print_json(rows)
        else:
            for r in rows:
                print(f"{r['workflow_id']:40} {r['status'] or '-':12} {r['started']}")
            if not rows:
                print("no runs")
        return EXIT_OK

    return asyncio.run(_with_client(config, go))


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """``90s``, ``30m``, ``2h``, ``1d`` (a positive number and one unit)."""
    number, unit = text[:-1], text[-1:].lower()
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in _DURATION_UNITS or value <= 0:
        raise argparse.ArgumentTypeError(f"bad duration {text!r}: a positive number and one of s, m, h, d")
    return timedelta(seconds=value * _DURATION_UNITS[unit])


def cmd_approve(args: argparse.Namespace, config: DurafixConfig) -> int:
    workflow_id = run_ref(args.run)

    async def go(client: Client) -> int:
        expires_at = datetime.now(UTC) + args.valid_for if args.valid_for is not None else None
        approval = Approval(
            reviewer=args.reviewer,
            head_sha=args.sha,
            evidence_digest=args.evidence,
            source="cli",
            expires_at=expires_at,
        )
        try:
            ack = await runs.approve(client, workflow_id, approval)
        except WorkflowUpdateFailedError as err:
            raise CliError(f"approval refused: {err.cause or err}") from err
        print(ack.detail)
        return EXIT_OK

    return asyncio.run(_with_client(config, go))


def cmd_reject(args: argparse.Namespace, config: DurafixConfig) -> int:
    workflow_id = run_ref(args.run)

    async def go(client: Client) -> int:
        await runs.reject(client, workflow_id, Rejection(reviewer=args.reviewer, reason=args.reason or ""))
        print(f"rejection sent to {workflow_id}")
        return EXIT_OK

    return asyncio.run(_with_client(config, go))


def cmd_cancel(args: argparse.Namespace, config: DurafixConfig) -> int:
    workflow_id = run_ref(args.run)

    async def go(client: Client) -> int:
        await runs.cancel(client, workflow_id)
        print(f"cancellation requested for {workflow_id}; cleanup of its resources follows")
        if args.wait:
            return await _watch(client, workflow_id, False)
        return EXIT_OK

    return asyncio.run(_with_client(config, go))


def cmd_history(args: argparse.Namespace, config: DurafixConfig) -> int:
    from pipeline.history import summarize_history

    workflow_id = run_ref(args.run)

    async def go(client: Client) -> int:
        history = await runs.handle_for(client, workflow_id).fetch_history()
        rows = summarize_history(history)
        if args.json:
            _print_json(rows)
        else:
            for r in rows:
                print(f"{r['time']}  {r['event']:28} {r['detail']}")
        return EXIT_OK

    return asyncio.run(_with_client(config, go))


def cmd_demo(args: argparse.Namespace, config: DurafixConfig) -> int:
    from pipeline.demo import run_demo

    return run_demo(
        config, as_json=args.json, keep=args.keep, env_provider=args.env, evidence=args.evidence, video=args.video
    )


def _delegate(module: str) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        import importlib

        main: Callable[[list[str]], int] = importlib.import_module(module).main
        return main(argv)

    return run


DELEGATED = {
    "forge": _delegate("infra.forge.cli"),
    "model": _delegate("infra.modelserver.cli"),
    "evidence": _delegate("pipeline.cli.evidence"),
    "cleanup": _delegate("pipeline.cli.cleanup"),
    "resources": _delegate("pipeline.cli.resources"),
    "cache": _delegate("pipeline.cli.cache"),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="durafix", description="Durable bug-repair pipeline on Temporal.")
    p.add_argument("--state-dir", help="state directory (default $DURAFIX_STATE_DIR or ./.durafix)")
    sub = p.add_subparsers(dest="command", required=True)

    dev = sub.add_parser("dev", help="the embedded local stack")
    dev.add_argument("action", choices=["up", "status", "down"])
    dev.add_argument("--model-script", help="script the scripted model server answers from")
    dev.add_argument("--evidence", choices=["local", "s3"], default="local", help="evidence store (up)")
    dev.add_argument("--env", choices=["local", "docker"], default="local", help="environment provider (up)")
    dev.add_argument("--json", action="store_true")
    dev.set_defaults(fn=cmd_dev)

    w = sub.add_parser("worker", help="run a worker")
    w.add_argument("--queues", default="all", help="comma list of orchestration,forge,environments,browser,model")
    w.set_defaults(fn=cmd_worker)

    s = sub.add_parser("serve", help="run the GitHub webhook receiver")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8787)
    s.set_defaults(fn=cmd_serve)

    st = sub.add_parser("start", help="start (or attach to) the run for a bug report")
    st.add_argument("--repo", required=True, help="OWNER/REPO")
    st.add_argument("--issue", type=int)
    st.add_argument("--report", help="a markdown file (first line: title) opened as an issue first")
    st.add_argument("--base", default="main")
    st.add_argument("--wait", action="store_true", help="follow the run until it ends")
    st.add_argument("--json", action="store_true")
    st.set_defaults(fn=cmd_start)

    for name, fn, helptext in (
        ("status", cmd_status, "a run's state"),
        ("history", cmd_history, "a run's event history"),
    ):
        c = sub.add_parser(name, help=helptext)
        c.add_argument("run", help="repair:OWNER/REPO#N or OWNER/REPO#N")
        c.add_argument("--json", action="store_true")
        if name == "status":
            c.add_argument("--watch", action="store_true", help="follow until the run ends")
        c.set_defaults(fn=fn)

    ls = sub.add_parser("list", help="list runs")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(fn=cmd_list)

    ap = sub.add_parser("approve", help="approve a run's PR at a head SHA")
    ap.add_argument("run")
    ap.add_argument("--sha", required=True, help="the head SHA you reviewed (the merge enforces it)")
    ap.add_argument("--evidence", help="the evidence bundle digest you reviewed")
    ap.add_argument("--reviewer", default=os.environ.get("USER", "cli"))
    ap.add_argument(
        "--valid-for",
        type=parse_duration,
        metavar="DURATION",
        help="the approval expires after this long (e.g. 90m, 2h, 1d); unmerged by then, the run asks again",
    )
    ap.set_defaults(fn=cmd_approve)

    rj = sub.add_parser("reject", help="reject a run's PR")
    rj.add_argument("run")
    rj.add_argument("--reason")
    rj.add_argument("--reviewer", default=os.environ.get("USER", "cli"))
    rj.set_defaults(fn=cmd_reject)

    cn = sub.add_parser("cancel", help="cancel a run (its owned resources are cleaned up)")
    cn.add_argument("run")
    cn.add_argument("--wait", action="store_true")
    cn.set_defaults(fn=cmd_cancel)

    d = sub.add_parser("demo", help="run the whole pipeline offline on the embedded stack")
    d.add_argument("--json", action="store_true", help="print one JSON object at the end")
    d.add_argument("--keep", action="store_true", help="leave the stack running afterwards")
    d.add_argument("--env", choices=["local", "docker"], default="local")
    d.add_argument("--evidence", choices=["local", "s3"], default="local")
    d.add_argument("--video", action="store_true", help="record a video of every reproduction run (needs ffmpeg)")
    d.set_defaults(fn=cmd_demo)

    for name in DELEGATED:
        sub.add_parser(name, help=f"{name} commands (see `durafix {name} --help`)", add_help=False)
    return p


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    code = EXIT_OK
    try:
        code = _main(argv)
    except CliError as err:
        print(f"durafix: {err}", file=sys.stderr)
        code = err.code
    except KeyboardInterrupt:
        code = 130
    sys.stdout.flush()
    sys.stderr.flush()
    # A short-lived Temporal client can crash at interpreter exit; end without running finalizers.
    os._exit(code)


def _main(argv: list[str]) -> int:
    state_dir: str | None = None
    rest = list(argv)
    if rest and rest[0].startswith("--state-dir="):
        state_dir, rest = rest[0].partition("=")[2], rest[1:]
    elif len(rest) >= 2 and rest[0] == "--state-dir":
        state_dir, rest = rest[1], rest[2:]
    if rest and rest[0] in DELEGATED:
        if state_dir:
            os.environ["DURAFIX_STATE_DIR"] = state_dir
        return DELEGATED[rest[0]](rest[1:])
    args = build_parser().parse_args(argv)
    config = load_config(Path(args.state_dir) if args.state_dir else None)
    fn: Callable[[argparse.Namespace, DurafixConfig], int] = args.fn
    return fn(args, config)
