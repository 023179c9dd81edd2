"""``durafix dev onboard DIR``: one command from a checkout to a repository on the local stack's emulator
that durafix repairs.

It creates ``OWNER/NAME`` (``maintainer/<directory name>`` by default), pushes the whole history of the
checkout's HEAD as ``main`` with the tags in it, gives the worker's account (the bot) and a reviewer push
access, creates the trigger label, installs the webhook to the receiver, and prints the repository, which
token is whose and what to run next. Every step is idempotent, so running it again after a new commit
pushes that commit and changes nothing else; a ``main`` that moved on the forge (a merged fix) is never
overwritten.

Exit codes: 0 onboarded; 1 the forge or git refused; 2 the checkout cannot be onboarded (no committed,
valid ``durafix.yaml``, not a repository's root, a name the forge would refuse) or there is no emulator
to administer.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from environments.spec import RECIPE_FILE, RecipeError, load_recipe
from pipeline.cli.command import EXIT_OK, EXIT_USAGE, CliError
from pipeline.cli.forge import LocalForge, local_tokens
from pipeline.cli.output import print_json
from pipeline.config import DurafixConfig
from pipeline.ops import forge_setup
from pipeline.ops.forge_setup import ForgeApi, ForgeSetupError, GitError

DEFAULT_OWNER = "maintainer"
DEFAULT_RECEIVER_URL = "http://127.0.0.1:8787/webhook"
"""Where ``durafix serve`` (default host and port) receives webhooks."""
_REPO_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def run_onboard(args: argparse.Namespace, config: DurafixConfig, emulator: LocalForge | None) -> int:
    """Onboard ``args.dir`` (see the module's docstring) and print the result (one JSON object with
    ``--json``)."""
    checkout = Path(args.dir).resolve()
    _check_checkout(checkout)
    if emulator is None:
        raise CliError(
            f"`durafix dev onboard` works against the local stack, and {config.state_dir} has none whose emulator "
            f"is the configured forge ({config.forge_api_url}): start it with `durafix dev up` (on GitHub, see "
            "`durafix forge --help` and docs/onboarding.md)",
            EXIT_USAGE,
        )
    if emulator.running is False:
        raise CliError(f"the local stack's emulator ({emulator.api_url}) is not running: `durafix dev up`", EXIT_USAGE)
    if not config.webhook_secret:
        raise CliError("no webhook secret configured (DURAFIX_WEBHOOK_SECRET or `durafix dev up`)", EXIT_USAGE)
    name = args.name or checkout.name
    if not _REPO_NAME.match(name) or name in (".", ".."):
        raise CliError(f"{name!r} is not a repository name (letters, digits, . _ -): give one with --name", EXIT_USAGE)
    try:
        result = onboard(
            config,
            emulator,
            checkout,
            repository=f"{args.owner}/{name}",
            reviewer=args.reviewer or emulator.reviewer_login,
            receiver_url=args.receiver_url or DEFAULT_RECEIVER_URL,
        )
    except (ForgeSetupError, GitError) as err:
        raise CliError(str(err)) from err
    if args.json:
        print_json(result)
    else:
        _print(result)
    return EXIT_OK


def onboard(
    config: DurafixConfig,
    emulator: LocalForge,
    checkout: Path,
    *,
    repository: str,
    reviewer: str,
    receiver_url: str,
) -> dict[str, Any]:
    """Do the onboarding (the checkout has been checked) and return what it did and found."""
    owner, _ = forge_setup.split_repository(repository)
    admin = ForgeApi(emulator.api_url, emulator.admin_token)
    bot = _bot_login(config)
    for login in (owner, reviewer):
        forge_setup.ensure_user(admin, login)
    owner_token = forge_setup.mint_token(admin, owner)
    api = ForgeApi(config.forge_api_url, owner_token)

    repo = forge_setup.ensure_repository(api, repository)
    pushed = forge_setup.push_history(checkout, config.clone_url(repository), owner_token)
    for login in (bot, reviewer):
        forge_setup.set_collaborator(api, repository, login, "push")
    label_created = forge_setup.ensure_label(
        api, repository, config.trigger_label, description="durafix reproduces and repairs this report"
    )
    hook = forge_setup.ensure_webhook(api, repository, receiver_url, config.webhook_secret)

    tokens = local_tokens(config, emulator)
    tokens["bot"]["login"] = bot
    if reviewer != emulator.reviewer_login or not emulator.reviewer_token:
        tokens["reviewer"] = {**tokens["reviewer"], "login": reviewer, "token": forge_setup.mint_token(admin, reviewer)}
    tokens = {
        "owner": {"login": owner, "token": owner_token, "use": "owns the repository: its settings, hooks, pushes"},
        **tokens,
    }
    receiver_answers = _answers(receiver_url)
    port = urlsplit(receiver_url).port or 8787
    issue = f"{repository}#<issue number>"
    steps = [] if receiver_answers else [f"durafix serve --port {port}   # in a terminal of its own: the receiver"]
    steps += [
        "durafix worker   # in a terminal of its own, unless one runs",
        f"durafix start --repo {repository} --report REPORT.md   # opens an issue labelled {config.trigger_label}",
        f"durafix status {issue} --watch",
    ]
    return {
        "repository": repo.full_name,
        "html_url": repo.html_url,
        "clone_url": config.clone_url(repository),
        "created": repo.created,
        "pushed": {
            "branch": pushed.branch,
            "as": "main",
            "head": pushed.head,
            "commits": pushed.commits,
            "tags": list(pushed.tags),
        },
        "collaborators": {bot: "push", reviewer: "push"},
        "label": {"name": config.trigger_label, "created": label_created},
        "webhook": {"id": hook.hook_id, "url": hook.url, "events": list(hook.events), "created": hook.created},
        "receiver": {"url": receiver_url, "answering": receiver_answers},
        "tokens": tokens,
        "issues_api": f"{config.forge_api_url.rstrip('/')}/repos/{repository}/issues",
        "next": steps,
    }


def _check_checkout(checkout: Path) -> None:
    """Refuse what cannot be onboarded, before anything is created: no git repository root, no
    ``durafix.yaml``, one that is not committed, or one the pipeline would refuse."""
    if not checkout.is_dir():
        raise CliError(f"{checkout} is not a directory", EXIT_USAGE)
    if not (checkout / RECIPE_FILE).is_file():
        raise CliError(
            f"{checkout} has no {RECIPE_FILE}: the pipeline builds, starts and tests the repository from it; "
            f"`durafix init {checkout}` writes a starter to check and commit",
            EXIT_USAGE,
        )
    top = _git(checkout, "rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != checkout:
        raise CliError(f"{checkout} is not the root of a git repository (git rev-parse --show-toplevel)", EXIT_USAGE)
    committed = _git(checkout, "show", f"HEAD:{RECIPE_FILE}")
    if committed is None:
        raise CliError(
            f"{RECIPE_FILE} is not committed on HEAD of {checkout}: runs read it from the pushed revision; "
            "commit it first",
            EXIT_USAGE,
        )
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / RECIPE_FILE).write_text(committed, encoding="utf-8")
        try:
            load_recipe(Path(scratch))
        except RecipeError as err:
            # The parser names the file it read, a scratch copy of the committed one.
            problem = str(err).replace(f"{Path(scratch) / RECIPE_FILE}: ", "")
            raise CliError(f"{checkout}: the committed {RECIPE_FILE} is refused: {problem}", EXIT_USAGE) from err


def _git(checkout: Path, *args: str) -> str | None:
    """The command's output, or None when it failed."""
    done = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def _bot_login(config: DurafixConfig) -> str:
    if not config.forge_token:
        raise CliError("no forge token configured for the worker (DURAFIX_FORGE_TOKEN or `durafix dev up`)", EXIT_USAGE)
    try:
        return str(ForgeApi(config.forge_api_url, config.forge_token).call("GET", "/user")["login"])
    except ForgeSetupError as err:
        raise CliError(f"the worker's forge token does not work on {config.forge_api_url}: {err}") from err


def _answers(url: str) -> bool:
    """Whether anything answers HTTP at ``url`` (the receiver answers a GET with 501: that is an answer)."""
    try:
        httpx.get(url, timeout=3.0, trust_env=False)
    except httpx.HTTPError:
        return False
    return True


def _print(r: dict[str, Any]) -> None:
    pushed = r["pushed"]
    source = f"branch {pushed['branch']}" if pushed["branch"] else "detached HEAD"
    tags = ", ".join(pushed["tags"]) or "none"
    print(f"repository    {r['repository']}  {r['html_url']}  ({'created' if r['created'] else 'existed'})")
    print(f"clone         {r['clone_url']}")
    commits = f"{pushed['commits']} commit{'s' if pushed['commits'] != 1 else ''}"
    print(f"pushed        main = {pushed['head'][:12]} ({source}, {commits}); tags: {tags}")
    print("collaborators " + ", ".join(f"{login} ({perm})" for login, perm in r["collaborators"].items()))
    print(f"label         {r['label']['name']} ({'created' if r['label']['created'] else 'existed'})")
    hook = r["webhook"]
    print(
        f"webhook       {hook['url']} ({'created' if hook['created'] else 'updated'}, hook {hook['id']}): "
        f"{', '.join(hook['events'])}"
    )
    if r["receiver"]["answering"]:
        print(f"receiver      answering at {r['receiver']['url']}")
    else:
        print(
            f"receiver      nothing answers at {r['receiver']['url']}: start it (below) before opening an issue; "
            "deliveries it misses are not sent again"
        )
    print("tokens")
    for role, entry in r["tokens"].items():
        print(f"  {role:9} {entry['login'] or '-':13} {entry['token'] or '(none recorded)':42} {entry['use']}")
    print("next")
    for step in r["next"]:
        print(f"  {step}")
    print(f"  (or open the issue as the owner: POST {r['issues_api']} with labels [{r['label']['name']!r}])")
