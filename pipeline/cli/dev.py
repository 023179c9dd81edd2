"""The commands that run parts of durafix: ``durafix dev`` (the embedded stack, and onboarding a checkout
into it), ``demo``, ``worker``, ``serve``, and ``forge`` / ``model`` (the stack's GitHub emulator and scripted
model server, run on their own; ``forge`` also sets repositories up, see :mod:`pipeline.cli.forge`).

``dev``, ``demo``, ``forge serve`` and ``model`` need ``infra``, the local stack, which lives in the source
checkout and is no part of the installed product: they import it inside the command only, and this module is
where the commands that set repositories up (``forge``, ``dev onboard``) learn about the stack's emulator
(:func:`local_forge`), so those work from an installed durafix too when pointed at an emulator.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pipeline.cli.command import EXIT_FAIL, EXIT_OK, EXIT_USAGE, AddArguments, CliError
from pipeline.cli.output import print_json
from pipeline.config import DurafixConfig

if TYPE_CHECKING:
    from pipeline.cli.forge import LocalForge
    from pipeline.queue_settings import Overrides
    from pipeline.steps import TaskQueue

_Number = TypeVar("_Number", int, float)


@contextmanager
def _source_checkout(command: str) -> Iterator[None]:
    """Turn ``infra`` missing (durafix installed from a wheel, which carries the product packages only) into
    a :class:`CliError` saying where ``command`` runs; any other missing module still propagates."""
    try:
        yield
    except ModuleNotFoundError as err:
        if err.name is None or err.name.partition(".")[0] != "infra":
            raise
        raise CliError(
            f"`durafix dev` and `demo` run from a source checkout: `durafix {command}` needs the local stack "
            "(the repository's infra/ package), which an installed durafix does not include"
        ) from err


def cmd_dev(args: argparse.Namespace, config: DurafixConfig) -> int:
    """``dev up`` starts the stack's services that are not running, each on the port ``stack.json`` recorded
    for it (its clients already use it), and prints its services; ``dev status`` exits 1 unless every
    recorded service (``demo --keep``'s worker and receiver included) is alive; ``dev down`` stops them (exit
    1 naming any that would not stop); ``dev onboard`` is :mod:`pipeline.cli.onboard`. ``dev up`` with
    options other than the running stack's is refused (exit 2, nothing started or changed:
    :class:`infra.stack.StackConflict`); a dead service's port held by another process is exit 1
    (:class:`infra.stack.PortTaken`, naming the holder; nothing moved to another port)."""
    if args.action == "onboard":
        from pipeline.cli.onboard import run_onboard

        return run_onboard(args, config, local_forge(config))
    with _source_checkout("dev"):
        from infra import stack

    if args.action == "up":
        try:
            cfg = stack.up(
                config.state_dir,
                model_script=Path(args.model_script) if args.model_script else None,
                evidence=args.evidence,
                environments=args.env,
            )
        except stack.StackConflict as err:
            raise CliError(str(err), EXIT_USAGE) from err
        except stack.PortTaken as err:
            raise CliError(str(err)) from err
        info = stack.status(cfg.state_dir)
        if args.json:
            print_json(info)
        else:
            for name, svc in info.items():
                print(f"{name:9} {svc['url']}" + (f"  (ui {svc['ui']})" if "ui" in svc else ""))
            print(f"state     {cfg.state_dir}")
        return EXIT_OK
    if args.action == "status":
        info = stack.status(config.state_dir)
        if args.json:
            print_json(info)
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
    """Run a worker on ``--queues`` until interrupted; a configured secret file readable inside the sandbox
    (:mod:`pipeline.sandbox_exposure`), an unknown queue, invalid queue settings or a queue this host cannot
    serve (:mod:`pipeline.capabilities`: no Chromium for ``browser``, ...) is a usage error (exit 2), found
    once, here, before any child is started or Temporal is reached. ``--check`` prints what each queue needs
    and what was found (and each exposed file), and exits 1 if any queue cannot be served or a file is
    exposed. The pollers run in a child process under :mod:`pipeline.supervisor` (exit 1 when its children
    keep dying); ``--no-supervise`` runs them in this process."""
    from browser.video import VideoUnavailable
    from pipeline.queue_settings import Overrides
    from pipeline.supervisor import is_child, supervise
    from pipeline.worker import parse_queues, run_worker

    try:
        queues = parse_queues(args.queues)
    except ValueError as err:
        raise CliError(str(err), EXIT_USAGE) from err
    overrides = Overrides(max_concurrent=args.max_concurrent, rate_per_s=args.rate_per_s)
    if not is_child():
        # A supervised child is the same command line again: its parent checked this host already.
        served = _check_host(config, queues, overrides, report=args.check_only)
        if args.check_only:
            return EXIT_OK if served else EXIT_FAIL
    if not (args.no_supervise or is_child()):
        return EXIT_OK if asyncio.run(supervise(config)) == 0 else EXIT_FAIL
    try:
        asyncio.run(run_worker(config, queues, standby=is_child(), overrides=overrides))
    except VideoUnavailable as err:
        raise CliError(f"browser_video is on but {err}", EXIT_USAGE) from err
    return EXIT_OK


def _check_host(config: DurafixConfig, queues: Sequence[TaskQueue], overrides: Overrides, *, report: bool) -> bool:
    """Check that no configured secret file is visible inside the sandbox (:mod:`pipeline.sandbox_exposure`),
    validate the queues' settings and probe this host for them. ``report``: print the table (and each exposed
    file) and return whether every queue can be served and nothing is exposed. Else refuse (exit 2) an exposed
    file or what cannot be served for good, warn of what did not answer, and advertise what was found; True."""
    from pipeline import capabilities
    from pipeline.queue_settings import worker_limits
    from pipeline.sandbox_exposure import exposures

    # Before anything else (and before Temporal is reached): a secret file a sandboxed command could read.
    exposed = [exposure.describe() for exposure in exposures(config)]
    if exposed and not report:
        raise CliError("worker not started: " + "\n".join(exposed), EXIT_USAGE)
    for queue in queues:
        worker_limits(config, queue, overrides)
    checks = capabilities.probe(config, queues)
    if report:
        print(capabilities.table(checks))
        for line in exposed:
            print(f"sandbox: {line}")
        return not exposed and all(check.ok for check in checks)
    why = capabilities.refusal(checks)
    if why is not None:
        raise CliError(f"worker not started: {why}", EXIT_USAGE)
    for warning in capabilities.warnings(checks):
        print(f"durafix worker: warning: {warning}", file=sys.stderr, flush=True)
    print(f"durafix worker {capabilities.advertisement(checks)}", file=sys.stderr, flush=True)
    return True


def cmd_serve(args: argparse.Namespace, config: DurafixConfig) -> int:
    """Serve the webhook receiver until interrupted; without a webhook secret it refuses (exit 2)."""
    from pipeline.webhooks import WebhookReceiver

    if not config.webhook_secret:
        raise CliError("no webhook secret configured (DURAFIX_WEBHOOK_SECRET or `durafix dev up`)", EXIT_USAGE)
    receiver = WebhookReceiver(config, args.host, args.port)
    if not args.no_reconcile:
        receiver.start_reconciler()
    print(f"durafix webhook receiver on {receiver.url}", file=sys.stderr, flush=True)
    try:
        receiver.serve_forever()
    except KeyboardInterrupt:
        print("durafix webhook receiver stopping", file=sys.stderr, flush=True)
    finally:
        receiver.stop()
    return EXIT_OK


def cmd_demo(args: argparse.Namespace, config: DurafixConfig) -> int:
    """The whole pipeline on the embedded stack; exit 0 only when the run merged (see :mod:`pipeline.demo`)."""
    from pipeline.demo import run_demo

    with _source_checkout("demo"):
        from infra.stack import StackConflict

        try:
            return run_demo(
                config,
                as_json=args.json,
                keep=args.keep,
                env_provider=args.env,
                evidence=args.evidence,
                video=args.video,
            )
        except StackConflict as err:
            raise CliError(str(err), EXIT_USAGE) from err


def cmd_forge(args: argparse.Namespace, config: DurafixConfig) -> int:
    """``durafix forge create-repo | add-collaborator | add-webhook | tokens`` (:mod:`pipeline.cli.forge`);
    any other ``durafix forge ARGS`` is the GitHub emulator's own command line (``python -m infra.forge``)."""
    from pipeline.cli import forge

    if forge.handles(args.rest):
        return forge.run(args.rest, config, lambda: local_forge(config))
    with _source_checkout("forge"):
        from infra.forge import cli

    return cli.main(args.rest)


def local_forge(config: DurafixConfig) -> LocalForge | None:
    """The emulator the repository-setup commands administer: the local stack's when the configured forge
    is it (its admin and reviewer tokens from the stack's state), else the configured forge when
    ``$DURAFIX_FORGE_ADMIN_TOKEN`` holds its admin token; None without either."""
    from pipeline.cli.forge import ADMIN_TOKEN_ENV, LocalForge

    admin_token = os.environ.get(ADMIN_TOKEN_ENV, "")
    found = _stack_forge(config, admin_token)
    if found is None and admin_token:
        found = LocalForge(
            api_url=config.forge_api_url,
            admin_token=admin_token,
            source=f"${ADMIN_TOKEN_ENV}",
            running=None,
            bot_login=None,
            reviewer_login="reviewer",
            reviewer_token="",
        )
    return found


def _stack_forge(config: DurafixConfig, admin_token: str) -> LocalForge | None:
    from pipeline.cli.forge import LocalForge

    try:
        from infra import processes, stack
    except ModuleNotFoundError as err:
        if err.name is None or err.name.partition(".")[0] != "infra":
            raise
        return None  # an installed durafix: no local stack, only an emulator named by the environment
    recorded = stack.read_stack(config.state_dir)
    rec = recorded.services.get("forge")
    if rec is None or f"{rec.url}/api/v3" != config.forge_api_url.rstrip("/"):
        return None
    if not (admin_token or recorded.admin_token):
        return None
    return LocalForge(
        api_url=config.forge_api_url,
        admin_token=admin_token or recorded.admin_token,
        source=f"the local stack in {config.state_dir}",
        running=processes.is_alive(rec),
        bot_login=stack.BOT_LOGIN,
        reviewer_login=stack.REVIEWER_LOGIN,
        reviewer_token=recorded.reviewer_token,
    )


def cmd_model(args: argparse.Namespace, config: DurafixConfig) -> int:
    """``durafix model ARGS``: the scripted model server's own command line (``python -m infra.modelserver``)."""
    with _source_checkout("model"):
        from infra.modelserver import cli

    return cli.main(args.rest)


def _dev_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser(
        "up",
        help="start the stack's services that are not running",
        description="Start the stack's services that are not running. A running stack keeps its options: one "
        "left out is the running stack's (else the default), one that differs is refused (exit 2) until "
        "`durafix dev down`.",
    )
    up.add_argument("--model-script", help="script the scripted model server answers from (default: the cart's)")
    up.add_argument("--evidence", choices=["local", "s3"], help="evidence store (default: local)")
    up.add_argument("--env", choices=["local", "docker"], help="environment provider (default: local)")
    status = actions.add_parser("status", help="whether each recorded service is alive")
    actions.add_parser("down", help="stop every recorded service")
    onboard = actions.add_parser(
        "onboard",
        help="push a checkout with a durafix.yaml into the stack's emulator as a repository durafix repairs",
        description="Create OWNER/NAME on the local stack's emulator, push the checkout's HEAD (whole history) as "
        "main with its tags, give the bot and a reviewer push access, install the webhook to the receiver, and "
        "print which token is whose and what to run next. Idempotent.",
    )
    onboard.add_argument("dir", metavar="DIR", help="the checkout's root (it must have a committed durafix.yaml)")
    onboard.add_argument("--name", help="the repository's name (default: the directory's)")
    onboard.add_argument("--owner", default="maintainer", help="the emulator user who owns it (default: maintainer)")
    onboard.add_argument("--reviewer", help="the login that approves PRs (default: the stack's reviewer)")
    onboard.add_argument(
        "--receiver-url", help="where `durafix serve` listens (default: http://127.0.0.1:8787/webhook)"
    )
    for sub in (up, status, onboard):
        sub.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(fn=cmd_dev)


def _worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queues", default="all", help="comma list of orchestration,forge,environments,browser,model")
    parser.add_argument(
        "--check",
        dest="check_only",
        action="store_true",
        help="print what each queue needs and what this host has, and exit (1 if any queue cannot be served)",
    )
    parser.add_argument(
        "--max-concurrent",
        type=_positive(int),
        metavar="N",
        help="tasks each queue's worker runs at once in this process (overrides DURAFIX_QUEUE_SETTINGS)",
    )
    parser.add_argument(
        "--rate-per-s",
        type=_positive(float),
        metavar="R",
        help="activities per second each activity queue's worker starts in this process (overrides the setting)",
    )
    parser.add_argument(
        "--no-supervise",
        action="store_true",
        help="poll in this process, with no supervisor to fail a dead worker's attempts at once (debugging)",
    )
    parser.set_defaults(fn=cmd_worker)


def _positive(kind: Callable[[str], _Number]) -> Callable[[str], _Number]:
    def parse(text: str) -> _Number:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, not {text!r}")
        return value

    return parse


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8787)
    parser.add_argument(
        "--no-reconcile",
        action="store_true",
        help="do not run the reconciler of lost events in this process (run `durafix reconcile` elsewhere)",
    )
    parser.set_defaults(fn=cmd_serve)


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    parser.add_argument("--keep", action="store_true", help="leave the stack running afterwards")
    parser.add_argument("--env", choices=["local", "docker"], default="local")
    parser.add_argument("--evidence", choices=["local", "s3"], default="local")
    parser.add_argument("--video", action="store_true", help="record a video of every reproduction run (needs ffmpeg)")
    parser.set_defaults(fn=cmd_demo)


ARGUMENTS: dict[str, AddArguments] = {
    "dev": _dev_arguments,
    "worker": _worker_arguments,
    "serve": _serve_arguments,
    "demo": _demo_arguments,
    # Their parsers live with the servers in infra (the command passes its arguments through, --help too).
    "forge": lambda parser: parser.set_defaults(fn=cmd_forge),
    "model": lambda parser: parser.set_defaults(fn=cmd_model),
}
