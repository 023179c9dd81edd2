"""``durafix demo``: the whole pipeline, offline, on the embedded stack.

Boots the stack, pushes the sample app (``examples/cart``) into the GitHub emulator, registers the webhook
receiver, opens an issue with the trigger label (its webhook starts the run), waits for the draft PR,
approves it as a reviewer through the emulator's review API (that webhook carries the approval), waits for
the merge, and reads back from the forge what the run left there.

The worker and the receiver it starts are recorded in the stack (``STATE/stack.json``, as ``demo-worker`` and
``demo-receiver``): with ``--keep`` they go on running, ``durafix dev status`` lists them and ``durafix dev
down`` stops them with the rest; without it they are stopped with the stack at the end.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

from pipeline.config import DurafixConfig
from pipeline.ops import forge_setup
from pipeline.ops.forge_setup import ForgeApi, maintainer_git_env

__all__ = [
    "OWNER",
    "REPO_NAME",
    "ensure_user",
    "issue_text",
    "maintainer_git_env",
    "run_demo",
    "seed_repository",
    "unused_repository_name",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLE = REPO_ROOT / "examples" / "cart"
SAMPLE_FILES = ["app.py", "cart.py", "durafix.yaml", "README.md", "tests/__init__.py", "tests/test_cart.py"]
OWNER = "maintainer"
REPO_NAME = "cart"
# The names ``demo`` records its worker and receiver under in STATE/stack.json (``durafix dev status | down``).
DEMO_WORKER = "demo-worker"
DEMO_RECEIVER = "demo-receiver"
# How long the runs page link `--keep` prints opens the page without the token.
RUNS_LINK_HOURS = 24
# The login `durafix dev up` gives the worker's token (infra.stack.BOT_LOGIN; infra is imported lazily here).
BOT_LOGIN = "durafix-bot"


def _log(msg: str) -> None:
    print(f"demo: {msg}", file=sys.stderr, flush=True)


def ensure_user(config: DurafixConfig, admin: str, login: str) -> str:
    """Create the emulator user ``login`` unless it exists, and return a new token for it."""
    admin_api = ForgeApi(config.forge_api_url, admin)
    forge_setup.ensure_user(admin_api, login)
    return forge_setup.mint_token(admin_api, login)


def seed_repository(
    config: DurafixConfig, admin_token: str, reviewer: str, webhook_url: str, name: str = REPO_NAME
) -> str:
    """``maintainer/<name>`` with the sample app on ``main``, ``durafix-bot`` and ``reviewer`` as push
    collaborators and the webhook to ``webhook_url``. Idempotent (see :mod:`pipeline.ops.forge_setup`): the sample
    is pushed only into a repository without ``main``."""
    owner = ForgeApi(config.forge_api_url, ensure_user(config, admin_token, OWNER))
    repository = forge_setup.ensure_repository(owner, f"{OWNER}/{name}").full_name
    if not owner.exists(f"/repos/{repository}/branches/main"):
        _push_sample(config, repository, owner.token)
        _log(f"pushed the sample app to {config.forge_git_base}/{repository}")
    for login in (BOT_LOGIN, reviewer):
        forge_setup.set_collaborator(owner, repository, login, "push")
    forge_setup.ensure_webhook(owner, repository, webhook_url, config.webhook_secret)
    return repository


def unused_repository_name(config: DurafixConfig, admin_token: str, base: str = REPO_NAME) -> str:
    """``base``, or ``base-2``, ``base-3``, ... : the first name the owner has no repository under. Each demo
    seeds a fresh copy of the sample, so a second demo finds the bug unfixed on its ``main`` again."""
    owner = ForgeApi(config.forge_api_url, ensure_user(config, admin_token, OWNER))
    for n in range(1, 10_000):
        name = base if n == 1 else f"{base}-{n}"
        if not owner.exists(f"/repos/{OWNER}/{name}"):
            return name
    raise RuntimeError(f"no free repository name under {OWNER}/{base}-N")


def _push_sample(config: DurafixConfig, repository: str, token: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "sample"
        for rel in SAMPLE_FILES:
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(SAMPLE / rel, work / rel)
        env = maintainer_git_env(token, Path(tmp))
        for cmd in (
            ["git", "init", "-q", "-b", "main"],
            ["git", "add", "-A"],
            ["git", "commit", "-q", "-m", "Sample shop with a cart"],
        ):
            subprocess.run(cmd, cwd=work, env=env, check=True, capture_output=True)
        forge_setup.push_history(work, config.clone_url(repository), token)


def issue_text() -> tuple[str, str]:
    text = (SAMPLE / "ISSUE.md").read_text()
    title, _, body = text.partition("\n")
    return title.lstrip("# ").strip(), body.strip() + "\n"


def run_demo(
    config: DurafixConfig,
    *,
    as_json: bool,
    keep: bool,
    env_provider: Literal["local", "docker"],
    evidence: Literal["local", "s3"],
    video: bool = False,
) -> int:
    from infra import processes, stack
    from infra.cli.demo_run import DemoRun

    state_dir = config.state_dir
    _log(f"booting the embedded stack in {state_dir}")
    config = stack.up(state_dir, evidence=evidence, environments=env_provider, quiet=as_json)
    config.fast_timeouts = True
    config.browser_video = video
    config.save()
    stack_state = stack.read_stack(state_dir)
    # A kept earlier demo's worker and receiver run with that demo's configuration: replaced, not doubled.
    for name in (DEMO_WORKER, DEMO_RECEIVER):
        earlier = stack_state.services.get(name)
        if earlier is not None:
            processes.stop(earlier)
    children: list[processes.ServiceRecord] = []
    try:
        worker = processes.spawn(
            DEMO_WORKER,
            [sys.executable, "-m", "pipeline", "--state-dir", str(state_dir), "worker"],
            log=state_dir / "logs" / "demo-worker.log",
            port=0,
            url="",
        )
        children.append(worker)
        # Recorded in the stack at once: whatever becomes of this process, `durafix dev down` stops them.
        stack.record(state_dir, worker)
        receiver = stack.spawn_receiver(state_dir, DEMO_RECEIVER, "demo-receiver.log")
        children.append(receiver)
        stack.record(state_dir, receiver)
        stack.wait_receiver(receiver, 90)
        name = unused_repository_name(config, stack_state.admin_token)
        repository = seed_repository(config, stack_state.admin_token, "reviewer", receiver.url, name=name)
        title, body = issue_text()
        result = DemoRun(config, repository, stack_state.reviewer_token).run(title, body, quiet=as_json)
    finally:
        if not keep:
            for child in children:
                processes.stop(child)
            stack.down(state_dir, quiet=as_json)
    if keep:
        result["runs_page"] = runs_page_link(config, receiver.url)
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        _print_summary(result)
        if keep:
            print(
                f"\nthe stack, its worker and its receiver ({receiver.url}) are still running (state {state_dir}); "
                "`durafix dev status` lists them, `durafix dev down` stops them"
            )
            print(
                f"runs page {result['runs_page']}\n"
                f"          (a signed link, valid {RUNS_LINK_HOURS} h; or send Authorization: Bearer with "
                "operator_token from config.json)"
            )
    return 0 if result["outcome"] == "merged" else 1


def runs_page_link(config: DurafixConfig, webhook_url: str) -> str:
    """A signed link to the receiver's runs page, valid :data:`RUNS_LINK_HOURS` hours."""
    from pipeline.cli.runs_page import signed_runs_link

    return signed_runs_link(config, webhook_url.removesuffix("/webhook"), valid_s=RUNS_LINK_HOURS * 3600)


def _print_summary(r: dict[str, Any]) -> None:
    print(f"\nrun       {r['workflow_id']}")
    print(f"outcome   {r['outcome']}  ({r['detail']})")
    print(f"ticket    {r['ticket']}")
    print(f"branch    {r['branch']}")
    print(f"PR        {r['pr']}")
    print(f"approved  {r['approved_sha']}")
    print(f"merged    {r['merged_sha']}")
    print(
        f"forge     tickets {r['tickets']}, PRs {r['prs']}, evidence comments {r['evidence_comments']}, "
        f"branches {r['branches']}"
    )
    print(f"fix       {'on main in the merged commit' if r['fix_in_merged_commit'] else 'NOT found on main'}")
    kinds: dict[str, int] = {}
    for e in r["evidence"]:
        kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
    print(f"evidence  {len(r['evidence'])} artifacts: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    print(f"          bundle digest {r['evidence_digest']}")
    print(f"          report {r['report_url']}")
    for e in r["evidence"]:
        if e["kind"] in ("patch", "manifest"):
            print(f"          {e['kind']:9} {e['name']}  sha256 {e['sha256']}")
    print(f"took      {r['seconds']:.1f}s")
