"""What the repository-setup command tests share: a real GitHub emulator over HTTP that the ``durafix``
command is pointed at by configuration alone (``STATE/config.json`` and ``$DURAFIX_FORGE_ADMIN_TOKEN``, as
for any emulator), a receiver that records the webhooks it gets, and git checkouts with history and tags."""

from __future__ import annotations

import hashlib
import hmac
import os
import subprocess
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from environments.processes import read_stat
from infra.forge.testing import ForgeHandle, running_forge
from infra.processes import ServiceRecord
from infra.stack import StackState
from pipeline import config as config_module
from pipeline.cli import run_command
from pipeline.cli.forge import ADMIN_TOKEN_ENV, OWNER_TOKEN_ENV
from pipeline.config import DurafixConfig
from tests.support.forge import GIT_ENV, Receiver
from tests.support.forge import running_receiver as forge_receiver
from tests.support.gitrepo import write_files

WEBHOOK_SECRET = "onboarding-hook-secret"


@dataclass
class Emulator:
    forge: ForgeHandle
    state_dir: Path
    bot_token: str

    def durafix(self, *args: str) -> int:
        return run_command(["--state-dir", str(self.state_dir), *args])

    def api(self, method: str, path: str, token: str | None = None, body: Any = None) -> Any:
        """The emulator's API (the admin token when no token is given)."""
        return self.forge._call(method, path, token, body)

    def clone_url(self, repository: str) -> str:
        return f"{self.forge.base_url}/{repository}.git"

    def remote_refs(self, repository: str) -> dict[str, str]:
        out = git(self.state_dir, "ls-remote", self.clone_url(repository))
        return {ref: sha for sha, ref in (line.split("\t") for line in out.splitlines())}


@contextmanager
def configured_emulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Emulator]:
    """An emulator with the worker's account (``durafix-bot``), and a state directory whose configuration
    names it, its bot token and a webhook secret; its admin token is in ``$DURAFIX_FORGE_ADMIN_TOKEN``."""
    for name in [*config_module._ENV, ADMIN_TOKEN_ENV, OWNER_TOKEN_ENV]:
        monkeypatch.delenv(name, raising=False)
    with running_forge(tmp_path / "forge") as forge:
        bot = forge.create_user("durafix-bot")
        state = tmp_path / "state"
        DurafixConfig(
            state_dir=state,
            forge_api_url=forge.api_url,
            forge_git_base=forge.base_url,
            forge_token=bot,
            webhook_secret=WEBHOOK_SECRET,
        ).save()
        monkeypatch.setenv(ADMIN_TOKEN_ENV, forge.admin_token)
        yield Emulator(forge, state, bot)


def record_stack(emulator: Emulator, *, pid: int | None = None) -> StackState:
    """A stack state as `durafix dev up` writes it, whose emulator is this test's: served by this process,
    or recorded under ``pid`` (a process that has ended, for a stack whose emulator died)."""
    stat = read_stat(pid or os.getpid())
    start_ticks = stat.start_time if stat is not None else 1
    reviewer = emulator.forge.create_user("reviewer")
    forge = ServiceRecord(
        name="forge", pid=pid or os.getpid(), start_ticks=start_ticks, port=0, url=emulator.forge.base_url, log=""
    )
    state = StackState(services={"forge": forge}, admin_token=emulator.forge.admin_token, reviewer_token=reviewer)
    (emulator.state_dir / "stack.json").write_text(state.model_dump_json())
    return state


def signed_with(secret: str, body: bytes, headers: dict[str, str]) -> bool:
    """Whether a delivery carries GitHub's HMAC-SHA256 signature of ``body`` under ``secret``."""
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    signature = {k.lower(): v for k, v in headers.items()}.get("x-hub-signature-256", "")
    return hmac.compare_digest(expected, signature)


def running_receiver() -> AbstractContextManager[Receiver]:
    """A webhook receiver at ``/webhook`` on a free port, recording every POST and answering 200."""
    return forge_receiver("/webhook")


def git(cwd: Path, *args: str) -> str:
    """The git CLI in ``cwd`` with a fixed identity and no host configuration."""
    env = {**os.environ, **GIT_ENV}
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


RECIPE = """\
setup: []
start: python3 app.py --port $PORT
readiness: {path: /healthz}
test: python3 -m unittest discover
"""


def commit(checkout: Path, files: dict[str, str], message: str) -> str:
    write_files(checkout, files)
    git(checkout, "add", "-A")
    git(checkout, "commit", "-q", "-m", message)
    return git(checkout, "rev-parse", "HEAD")
