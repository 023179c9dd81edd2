"""``durafix forge create-repo | add-collaborator | add-webhook | tokens``: setting a repository up for
durafix on the configured forge (``DURAFIX_FORGE_API_URL``: the local stack's emulator, GitHub, GitHub
Enterprise). Any other ``durafix forge`` sub-command (``serve``) is the emulator's own (``infra.forge.cli``).

Which token acts: ``$DURAFIX_FORGE_OWNER_TOKEN`` when set (on GitHub it must be, see docs/onboarding.md for
its permissions); otherwise, on an emulator durafix can administer (:class:`LocalForge`: the local stack's,
or one whose admin token is in ``$DURAFIX_FORGE_ADMIN_TOKEN``), a token minted for the repository's owner,
who is created if needed. The worker's own token (``DURAFIX_FORGE_TOKEN``, the bot's) never administers a
repository here: it is the one being given access.

Every command is idempotent (see :mod:`pipeline.ops.forge_setup`). Exit codes: 0 done, 1 the forge refused or
did not answer, 2 usage (no token to act with, no webhook secret), 3 ``tokens`` without a local stack.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.cli.command import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, AddArguments, CliError, needs_source_checkout
from pipeline.cli.output import print_json
from pipeline.config import DurafixConfig
from pipeline.ops import forge_setup
from pipeline.ops.forge_setup import ForgeApi, ForgeSetupError

OWNER_TOKEN_ENV = "DURAFIX_FORGE_OWNER_TOKEN"
ADMIN_TOKEN_ENV = "DURAFIX_FORGE_ADMIN_TOKEN"
SUBCOMMANDS = ("create-repo", "add-collaborator", "add-webhook", "tokens")


@dataclass(frozen=True)
class LocalForge:
    """An emulator durafix administers through its ``/admin`` API (``durafix dev`` finds it)."""

    api_url: str
    admin_token: str
    source: str
    """Where it was found: the local stack's state, or ``$DURAFIX_FORGE_ADMIN_TOKEN``."""
    running: bool | None
    """Whether the stack's emulator process lives; None when it is not the stack's (then unknown)."""
    bot_login: str | None
    """Whom the worker's token belongs to, as the stack created it; None when not known."""
    reviewer_login: str
    reviewer_token: str
    """The stack's reviewer's token; empty when none is recorded."""


LocalForgeLookup = Callable[[], LocalForge | None]


def named_forge(config: DurafixConfig) -> LocalForge | None:
    """The configured forge as an emulator durafix administers when ``$DURAFIX_FORGE_ADMIN_TOKEN`` holds its
    admin token; None otherwise (the local stack's own emulator is found by the stack's ``forge`` command)."""
    admin_token = os.environ.get(ADMIN_TOKEN_ENV, "")
    if not admin_token:
        return None
    return LocalForge(
        api_url=config.forge_api_url,
        admin_token=admin_token,
        source=f"${ADMIN_TOKEN_ENV}",
        running=None,
        bot_login=None,
        reviewer_login="reviewer",
        reviewer_token="",
    )


def cmd_forge(args: argparse.Namespace, config: DurafixConfig) -> int:
    """``durafix forge`` of an installed durafix: the repository-setup commands against the forge named by the
    environment; the emulator's own sub-commands (``serve``) need the local stack, which replaces this
    command with its own where it is present."""
    if not handles(args.rest):
        raise needs_source_checkout("forge")
    return run(args.rest, config, lambda: named_forge(config))


def handles(rest: list[str]) -> bool:
    """Whether ``durafix forge REST`` is one of this module's commands (or the help listing them all)."""
    return not rest or rest[0] in SUBCOMMANDS or rest[0] in ("-h", "--help")


def run(rest: list[str], config: DurafixConfig, local: LocalForgeLookup) -> int:
    """Parse ``durafix forge REST`` and run it; a refusal is :class:`CliError`."""
    args = _parser().parse_args(rest)
    fn: Callable[[argparse.Namespace, DurafixConfig, LocalForgeLookup], int] = args.fn
    try:
        return fn(args, config, local)
    except ForgeSetupError as err:
        raise CliError(str(err)) from err
    except ValueError as err:
        raise CliError(str(err), EXIT_USAGE) from err


def owner_api(config: DurafixConfig, owner: str, local: LocalForgeLookup, *, create: bool = False) -> ForgeApi:
    """A client acting as ``owner`` (see the module's docstring for which token); with ``create`` the owner
    is created on the emulator if missing. No token to act with is :class:`CliError` (exit 2)."""
    token = os.environ.get(OWNER_TOKEN_ENV, "")
    if token:
        return ForgeApi(config.forge_api_url, token)
    emulator = local()
    if emulator is None:
        raise CliError(
            f"no token to act as {owner} on {config.forge_api_url}: set ${OWNER_TOKEN_ENV} to a token of {owner} "
            f"(or of an owner of the organisation {owner}); on the local stack (`durafix dev up`) durafix mints "
            "one itself",
            EXIT_USAGE,
        )
    admin = ForgeApi(emulator.api_url, emulator.admin_token)
    if create:
        forge_setup.ensure_user(admin, owner)
    try:
        return ForgeApi(emulator.api_url, forge_setup.mint_token(admin, owner))
    except ForgeSetupError as err:
        if err.status in (404, 422):
            raise CliError(f"{owner} is not a user of the emulator at {emulator.api_url}") from err
        raise


def _answer(args: argparse.Namespace, document: dict[str, Any], text: str) -> int:
    """A setup command's answer: ``document`` as one JSON object with ``--json``, else ``text``; exit 0."""
    if args.json:
        print_json(document)
    else:
        print(text)
    return EXIT_OK


def _create_repo(args: argparse.Namespace, config: DurafixConfig, local: LocalForgeLookup) -> int:
    owner, _ = forge_setup.split_repository(args.repository)
    repo = forge_setup.ensure_repository(
        owner_api(config, owner, local, create=True), args.repository, private=args.private
    )
    return _answer(
        args,
        {
            "repository": repo.full_name,
            "html_url": repo.html_url,
            "clone_url": repo.clone_url,
            "created": repo.created,
        },
        f"{'created' if repo.created else 'exists '} {repo.full_name}  {repo.html_url}\npush to {repo.clone_url}",
    )


def _add_collaborator(args: argparse.Namespace, config: DurafixConfig, local: LocalForgeLookup) -> int:
    owner, _ = forge_setup.split_repository(args.repository)
    api = owner_api(config, owner, local)
    emulator = local()
    if emulator is not None:
        # On the emulator, accounts are durafix's to make: a new reviewer needs no sign-up.
        forge_setup.ensure_user(ForgeApi(emulator.api_url, emulator.admin_token), args.login)
    in_force = forge_setup.set_collaborator(api, args.repository, args.login, args.permission)
    if in_force:
        text = f"{args.login} has {args.permission} on {args.repository}"
    else:
        text = (
            f"invited {args.login} to {args.repository} with {args.permission}: "
            f"{args.login} must accept the invitation before it counts"
        )
    return _answer(
        args,
        {
            "repository": args.repository,
            "login": args.login,
            "permission": args.permission,
            "invited": not in_force,
        },
        text,
    )


def _add_webhook(args: argparse.Namespace, config: DurafixConfig, local: LocalForgeLookup) -> int:
    if not config.webhook_secret:
        raise CliError("no webhook secret configured (DURAFIX_WEBHOOK_SECRET or `durafix dev up`)", EXIT_USAGE)
    owner, _ = forge_setup.split_repository(args.repository)
    hook = forge_setup.ensure_webhook(owner_api(config, owner, local), args.repository, args.url, config.webhook_secret)
    return _answer(
        args,
        {
            "repository": args.repository,
            "hook_id": hook.hook_id,
            "url": hook.url,
            "events": list(hook.events),
            "created": hook.created,
        },
        f"{'created' if hook.created else 'updated'} hook {hook.hook_id} on {args.repository}: {hook.url}, "
        f"events {', '.join(hook.events)}, signed with the configured webhook secret",
    )


def _tokens(args: argparse.Namespace, config: DurafixConfig, local: LocalForgeLookup) -> int:
    emulator = local()
    if emulator is None:
        raise CliError(
            f"no local stack in {config.state_dir} whose emulator is the configured forge "
            f"({config.forge_api_url}): start one with `durafix dev up`",
            EXIT_NOT_FOUND,
        )
    tokens = local_tokens(config, emulator)
    if tokens["bot"]["login"] is None and config.forge_token:
        # Whose it is is a nicety when the emulator is not the stack's; the token itself is what was asked for.
        with contextlib.suppress(ForgeSetupError):
            tokens["bot"]["login"] = ForgeApi(config.forge_api_url, config.forge_token).call("GET", "/user")["login"]
    if args.json:
        print_json(
            {
                "forge": {"api_url": emulator.api_url, "source": emulator.source, "running": emulator.running},
                **tokens,
            }
        )
        return EXIT_OK
    running = {True: "running", False: "NOT running: `durafix dev up`", None: "not the stack's own"}[emulator.running]
    print(f"forge     {emulator.api_url}  ({emulator.source}; {running})")
    for role, entry in tokens.items():
        print(f"{role:9} {entry['login'] or '-':13} {entry['token'] or '(none recorded)':42} {entry['use']}")
    return EXIT_OK


def local_tokens(config: DurafixConfig, emulator: LocalForge) -> dict[str, dict[str, Any]]:
    """Which token of an emulator is whose: role -> login, token, what it is for (``admin``, ``bot``,
    ``reviewer``)."""
    return {
        "admin": {
            "login": None,
            "token": emulator.admin_token,
            "use": "the emulator's /admin API (users, tokens, faults); counts as anonymous anywhere else",
        },
        "bot": {
            "login": emulator.bot_login,
            "token": config.forge_token,
            "use": "the worker's (forge_token): reads reports, pushes fix branches, opens draft PRs, merges",
        },
        "reviewer": {
            "login": emulator.reviewer_login,
            "token": emulator.reviewer_token,
            "use": "a push collaborator of onboarded repositories: approves draft PRs through the review API",
        },
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="durafix forge",
        description="Set repositories up for durafix on the configured forge, or run the GitHub emulator.",
    )
    commands = parser.add_subparsers(dest="forge_command", required=True, metavar="COMMAND")
    # Listed for the help only: `durafix forge serve ...` goes to the emulator's own parser.
    commands.add_parser("serve", help="run the GitHub emulator (its options: durafix forge serve --help)")

    create = commands.add_parser("create-repo", help="create OWNER/NAME, empty (idempotent)")
    create.add_argument("repository", metavar="OWNER/NAME")
    create.add_argument("--private", action="store_true")
    create.set_defaults(fn=_create_repo)

    collaborator = commands.add_parser("add-collaborator", help="give LOGIN a permission on OWNER/NAME (idempotent)")
    collaborator.add_argument("repository", metavar="OWNER/NAME")
    collaborator.add_argument("login", metavar="LOGIN")
    collaborator.add_argument("--permission", choices=forge_setup.PERMISSIONS, default="push")
    collaborator.set_defaults(fn=_add_collaborator)

    hook = commands.add_parser(
        "add-webhook",
        help="the hook durafix's receiver needs: issues, pull_request, pull_request_review, signed with the "
        "configured webhook secret (idempotent: one hook per URL)",
    )
    hook.add_argument("repository", metavar="OWNER/NAME")
    hook.add_argument("--url", required=True, help="the receiver's URL, e.g. http://HOST:8787/webhook")
    hook.set_defaults(fn=_add_webhook)

    tokens = commands.add_parser("tokens", help="the local stack's tokens: which is whose (admin, bot, reviewer)")
    tokens.set_defaults(fn=_tokens)
    for sub in (create, collaborator, hook, tokens):
        sub.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


ARGUMENTS: dict[str, AddArguments] = {"forge": lambda parser: parser.set_defaults(fn=cmd_forge)}
