"""``durafix chaos``: a soak of the local stack under faults (:mod:`infra.chaos`).

``durafix chaos --runs N --workers W --kill-every A-B --server-kills K [--state-dir DIR] [--seed S]
[--faults-for SECONDS] [--deadline SECONDS] [--concurrency C] [--keep]`` starts the embedded stack in a state
directory of its own (DIR, else a new temporary one), runs N repair runs of the sample app with W workers while
killing a random worker's activity process every A-B seconds (for the first SECONDS, with ``--faults-for``)
and the Temporal dev server K times, approves each run's PR on the forge, and prints one row per run and a
summary; the report is also written to DIR/chaos-report.json.

Exit codes: 0 every run ended within the deadline of its start with an honest outcome, one of each object on
the forge and nothing leaked; 1 any of those failed (the summary names each); 2 usage error, or DIR holds a
running stack. Like ``dev`` and ``demo``, it is the local stack's, added to ``durafix`` by a ``durafix.commands``
entry point; it imports the soak inside the command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import signal
import sys
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from pipeline.cli.command import EXIT_FAIL, EXIT_OK, EXIT_USAGE, AddArguments, CliError, Spec
from pipeline.config import DurafixConfig

T = TypeVar("T")


def _kill_every(text: str) -> tuple[float, float]:
    low, sep, high = text.partition("-")
    try:
        bounds = (float(low), float(high if sep else low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds A-B (e.g. 3-8), not {text!r}") from None
    if not 0 < bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"expected 0 < A <= B, not {text!r}")
    return bounds


DEFAULT_RUN_DEADLINE_S = 900.0
"""How long one soak run may take from its start: generous (six runs in flight on two busy cores under kills
took four minutes each), and per run, so a long soak is never failed for its length."""


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Soak the local stack: N repair runs of the sample app while workers and the Temporal dev server are "
        "killed; then count what each run left on the forge, its resume latencies and its leaks."
    )
    parser.add_argument("--runs", type=int, default=6, help="repair runs, one repository each (default 6)")
    parser.add_argument("--workers", type=int, default=2, help="`durafix worker` processes, all queues (default 2)")
    parser.add_argument(
        "--kill-every", type=_kill_every, default=(3.0, 8.0), metavar="A-B", help="seconds between worker kills"
    )
    parser.add_argument("--server-kills", type=int, default=1, help="Temporal dev server kills (default 1)")
    parser.add_argument(
        "--state-dir", dest="chaos_state_dir", metavar="DIR", help="the soak's state directory (default: a new one)"
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of the fault plan (default: random, printed)")
    parser.add_argument(
        "--faults-for",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop the faults after this long, then let the runs end on their own (default: faults until they end)",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=DEFAULT_RUN_DEADLINE_S,
        help=f"seconds a run may take from its start before it counts as lost (default {DEFAULT_RUN_DEADLINE_S:g})",
    )
    parser.add_argument("--concurrency", type=int, default=None, help="runs in flight at once (default 3 per worker)")
    parser.add_argument("--keep", action="store_true", help="leave the stack and the workers running afterwards")

    def check(args: argparse.Namespace) -> None:
        for name in ("runs", "workers"):
            if getattr(args, name) < 1:
                parser.error(f"--{name} must be at least 1")
        if args.server_kills < 0:
            parser.error("--server-kills must not be negative")
        if args.faults_for is not None and args.faults_for <= 0:
            parser.error("--faults-for must be positive")
        if args.concurrency is not None and args.concurrency < 1:
            parser.error("--concurrency must be at least 1")

    parser.set_defaults(fn=cmd_chaos, check=check)


def cmd_chaos(args: argparse.Namespace, config: DurafixConfig) -> int:
    from infra.chaos import Soak, SoakPlan, StateDirInUse, as_json, render

    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    state_dir = Path(args.chaos_state_dir) if args.chaos_state_dir else Path(tempfile.mkdtemp(prefix="durafix-chaos-"))
    concurrency = args.concurrency or min(args.runs, 3 * args.workers)
    plan = SoakPlan(
        runs=args.runs,
        workers=args.workers,
        kill_every=args.kill_every,
        server_kills=args.server_kills,
        seed=seed,
        state_dir=state_dir.resolve(),
        deadline_s=args.deadline,
        concurrency=concurrency,
        keep=args.keep,
        faults_for_s=args.faults_for,
    )
    soak = Soak(plan, lambda msg: print(f"chaos: {msg}", file=sys.stderr, flush=True))
    try:
        result = asyncio.run(_until_terminated(soak.run()))
    except StateDirInUse as err:
        raise CliError(str(err), EXIT_USAGE) from err
    except asyncio.CancelledError:
        raise CliError(
            f"interrupted; what the soak started is stopped (its logs stay in {plan.state_dir})", 130
        ) from None
    report = plan.state_dir / "chaos-report.json"
    report.write_text(json.dumps(as_json(result), indent=2))
    print(render(result))
    print(f"report   {report}")
    return EXIT_OK if result.ok else EXIT_FAIL


async def _until_terminated(soak: Coroutine[Any, Any, T]) -> T:
    """Run ``soak`` so that SIGTERM cancels it like Ctrl-C does: its teardown (workers, receiver, the stack)
    runs either way, and nothing it started outlives the command."""
    task = asyncio.ensure_future(soak)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await task


SPECS: dict[str, Spec] = {
    "chaos": Spec(
        __name__, "soak the embedded stack: runs under worker and Temporal server kills, then what they left"
    ),
}
"""The command this module adds to ``durafix`` (named by a ``durafix.commands`` entry point)."""

ARGUMENTS: dict[str, AddArguments] = {"chaos": _arguments}
