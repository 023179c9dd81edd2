"""The commands of the local stack, registered into ``durafix`` by the ``durafix.commands`` entry points
(:mod:`pipeline.cli.command`): ``durafix dev`` (the embedded stack, and onboarding a checkout into it),
``demo``, and ``forge`` / ``model`` (the stack's GitHub emulator and scripted model server, run on their own).

``forge`` here replaces the product's (:mod:`pipeline.cli.forge`): the same repository-setup commands, which
administer the local stack's emulator with the admin token its state recorded (:func:`local_forge`), and
every other ``durafix forge`` sub-command handed to the emulator's own command line. The stack's modules are
imported inside each command: ``durafix --help`` imports this module to list its commands.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.cli.command import EXIT_FAIL, EXIT_OK, EXIT_USAGE, AddArguments, CliError, Spec
from pipeline.cli.output import print_json
from pipeline.config import DurafixConfig

if TYPE_CHECKING:
    from pipeline.cli.forge import LocalForge


def cmd_dev(args: argparse.Namespace, config: DurafixConfig) -> int:
    """``dev up`` starts the stack's services that are not running, each on the port ``stack.json`` recorded
    for it (its clients already use it), and prints its services; ``dev status`` exits 1 unless every
    recorded service (``demo --keep``'s worker and receiver included) is alive; ``dev down`` stops them (exit
    1 naming any that would not stop); ``dev onboard`` is :mod:`infra.cli.onboard`. ``dev up`` with
    options other than the running stack's is refused (exit 2, nothing started or changed:
    :class:`infra.stack.StackConflict`); a dead service's port held by another process is exit 1
    (:class:`infra.stack.PortTaken`, naming the holder; nothing moved to another port)."""
    if args.action == "onboard":
        from infra.cli.onboard import run_onboard

        return run_onboard(args, config, local_forge(config))
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


def cmd_demo(args: argparse.Namespace, config: DurafixConfig) -> int:
    """The whole pipeline on the embedded stack; exit 0 only when the run merged (see :mod:`infra.cli.demo`)."""
    from infra.cli.demo import run_demo
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
    from infra.forge import cli

    return cli.main(args.rest)


def local_forge(config: DurafixConfig) -> LocalForge | None:
    """The emulator the repository-setup commands administer: the local stack's when the configured forge
    is it (its admin and reviewer tokens from the stack's state), else the product's answer
    (:func:`pipeline.cli.forge.named_forge`: the one whose admin token is in ``$DURAFIX_FORGE_ADMIN_TOKEN``)."""
    from pipeline.cli.forge import ADMIN_TOKEN_ENV, named_forge

    found = _stack_forge(config, os.environ.get(ADMIN_TOKEN_ENV, ""))
    return found if found is not None else named_forge(config)


def _stack_forge(config: DurafixConfig, admin_token: str) -> LocalForge | None:
    from infra import processes, stack
    from pipeline.cli.forge import LocalForge

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


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    parser.add_argument("--keep", action="store_true", help="leave the stack running afterwards")
    parser.add_argument("--env", choices=["local", "docker"], default="local")
    parser.add_argument("--evidence", choices=["local", "s3"], default="local")
    parser.add_argument("--video", action="store_true", help="record a video of every reproduction run (needs ffmpeg)")
    parser.set_defaults(fn=cmd_demo)


SPECS: dict[str, Spec] = {
    "dev": Spec(__name__, "the embedded local stack (up, status, down), and onboarding a checkout into it"),
    "demo": Spec(__name__, "run the whole pipeline offline on the embedded stack"),
    "forge": Spec(
        __name__,
        "set repositories up (create-repo, add-collaborator, add-webhook, tokens); serve the GitHub emulator",
        passes_through=True,
    ),
    "model": Spec(__name__, "the scripted model server (see `durafix model --help`)", passes_through=True),
}
"""The commands this module adds to ``durafix`` (each named by a ``durafix.commands`` entry point)."""

ARGUMENTS: dict[str, AddArguments] = {
    "dev": _dev_arguments,
    "demo": _demo_arguments,
    # Their parsers live with the servers in infra (the command passes its arguments through, --help too).
    "forge": lambda parser: parser.set_defaults(fn=cmd_forge),
    "model": lambda parser: parser.set_defaults(fn=cmd_model),
}
