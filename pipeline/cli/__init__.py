"""The ``durafix`` command line: one argparse tree over the command modules of this package, and the commands
the ``durafix.commands`` entry points add (the local stack's: see :mod:`pipeline.cli.command`).

Exit codes: 0 success, 1 a run or command failed, 2 usage error (or a setting that cannot be used, such as a
Temporal client certificate without its key), 3 the run or service was not found (each command's module states
its own refinements). Processes end with a flush and ``os._exit`` (a short-lived
Temporal client can crash at interpreter exit).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import cast

from pipeline.cli.command import EXIT_OK, EXIT_USAGE, Check, CliError, Command, Commands, Spec, with_plugins
from pipeline.config import SettingsError, load_config

__all__ = ["COMMANDS", "build_parser", "command_specs", "main", "run_command"]

COMMANDS: dict[str, Spec] = {
    "init": Spec("pipeline.cli.init", "write a starter durafix.yaml for a repository"),
    "check": Spec(
        "pipeline.cli.check", "dry-run a checkout's recipe (and a report's reproduction) in the sandbox, no forge"
    ),
    "worker": Spec("pipeline.cli.serve", "run a worker"),
    "serve": Spec("pipeline.cli.serve", "run the GitHub webhook receiver"),
    "start": Spec("pipeline.cli.runs", "start (or attach to) the run for a bug report"),
    "status": Spec("pipeline.cli.runs", "a run's state"),
    "history": Spec("pipeline.cli.runs", "a run's event history"),
    "list": Spec("pipeline.cli.runs", "list runs"),
    "approve": Spec("pipeline.cli.runs", "approve a run's PR at a head SHA"),
    "reject": Spec("pipeline.cli.runs", "reject a run's PR"),
    "cancel": Spec("pipeline.cli.runs", "cancel a run (its owned resources are cleaned up)"),
    "reconcile": Spec(
        "pipeline.cli.reconcile", "deliver to runs what lost webhook events would have told them (--once: one pass)"
    ),
    "forge": Spec(
        "pipeline.cli.forge",
        "set repositories up (create-repo, add-collaborator, add-webhook, tokens) on the configured forge",
        passes_through=True,
    ),
    "evidence": Spec("pipeline.cli.evidence", "the evidence store: serve it, apply retention"),
    "cleanup": Spec(
        "pipeline.cli.cleanup", "remove what a run owns, or what ended and unknown runs left (dry run unless --yes)"
    ),
    "resources": Spec("pipeline.cli.resources", "list the resources runs own (read-only)"),
    "cache": Spec("pipeline.cli.cache", "a worker's caches: prune what nobody has used for a while"),
}
"""The product's ``durafix`` commands: the module holding each, and its line in ``durafix --help``."""


def command_specs() -> dict[str, Spec]:
    """Every ``durafix`` command: the product's, then those the entry points add (one of the same name, such as
    the local stack's ``forge``, replaces the product's in place)."""
    return with_plugins(COMMANDS)


def build_parser() -> argparse.ArgumentParser:
    """The whole ``durafix`` parser tree (a command's arguments are added when it is parsed)."""
    parser = argparse.ArgumentParser(prog="durafix", description="Durable bug-repair pipeline on Temporal.")
    parser.add_argument("--state-dir", help="state directory (default $DURAFIX_STATE_DIR or ./.durafix)")
    commands = cast(Commands, parser.add_subparsers(dest="command", required=True, action=Commands))
    for name, spec in command_specs().items():
        commands.add_command(name, spec)
    return parser


def run_command(argv: list[str]) -> int:
    """Parse ``argv``, load the configuration (``--state-dir``, else ``$DURAFIX_STATE_DIR``, else
    ``./.durafix``) and run the command; returns its exit code. Usage errors raise ``SystemExit(2)`` before
    the configuration is read; a failed command may raise :class:`CliError`."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if getattr(args, "takes_rest", False):
        args.rest = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    check: Check | None = getattr(args, "check", None)
    if check is not None:
        check(args)
    config = load_config(Path(args.state_dir) if args.state_dir else None)
    fn: Command = args.fn
    return fn(args, config)


def main(argv: list[str] | None = None) -> None:
    """The console script: run the command, print a :class:`CliError` as ``durafix: ...``, and exit."""
    argv = sys.argv[1:] if argv is None else argv
    code = EXIT_OK
    try:
        code = run_command(argv)
    except CliError as err:
        print(f"durafix: {err}", file=sys.stderr)
        code = err.code
    except SettingsError as err:
        print(f"durafix: {err}", file=sys.stderr)
        code = EXIT_USAGE
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:
        # The reader went away (`durafix status ... | head`): nothing left to print can reach it, and a
        # traceback would read as a crash of the command.
        code = _quiet_stdout()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = _quiet_stdout()
    sys.stderr.flush()
    # A short-lived Temporal client can crash at interpreter exit; end without running finalizers.
    os._exit(code)


def _quiet_stdout() -> int:
    """Point stdout at /dev/null, so what is still buffered is dropped instead of raising again at exit; the
    exit code of a process its pipe's reader left (128 + SIGPIPE), as a shell reports it."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 128 + 13
