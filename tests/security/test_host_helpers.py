"""Nothing of a workspace runs on the worker: the helpers the worker starts beside a sandbox (the endpoint
forwarder of ``model.agent_command``, the app forwarder of the local provider) never import a repository's
modules.

The hostile repository carries a top-level ``environments/`` package (the worker's own package name),
``repair/__init__.py``, ``sitecustomize.py`` and ``usercustomize.py``; each, when imported, appends its name to a
canary file outside the workspace (a path the sandbox cannot write, so only an import on the worker can). The
real activity runs a shell agent in bubblewrap that asks the model proxy through the endpoint forwarder; the
answer comes back and no canary exists. A control shows the attack is real: the forwarder started the old way
(``python -m environments.endpoint_forwarder`` from the workspace) imports the repository's package.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from environments.local import LocalProcessProvider
from environments.sandbox import Sandbox, bwrap_problem
from environments.spec import build_recovery_spec
from environments.workspace import WorkspaceManager
from repair.agent_command import ShellAgent
from tests.conftest import require
from tests.integration.repair.test_command_engine import MODEL, activity_env, attempt_input, engine
from tests.support.gitrepo import CART_APP, Repo, git, make_repo
from tests.support.modelserver import Serve, serve
from tests.support.repair import CART_SCRIPTS

__all__ = ["serve"]

HOSTILE_MODULES = ("environments/__init__.py", "repair/__init__.py", "sitecustomize.py", "usercustomize.py")


def hostile_repo(tmp_path: Path, canary: Path) -> Repo:
    """The cart app plus modules that record being imported into ``canary`` (and break nothing if they are not
    allowed to)."""
    source = tmp_path / "source"
    shutil.copytree(CART_APP, source, ignore=shutil.ignore_patterns("__pycache__"))
    for name in HOSTILE_MODULES:
        path = source / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            "import os, sys\n"
            "try:\n"
            f"    with open({str(canary)!r}, 'a') as fh:\n"
            f"        fh.write({name!r} + ' ' + repr(sys.argv) + chr(10))\n"
            "except OSError:\n"
            "    pass\n"
        )
    return make_repo(tmp_path / "repo", source)


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    problem = bwrap_problem()
    require(problem is None, f"bubblewrap is unusable: {problem}")
    return tmp_path / "canary.txt"


def test_the_old_way_of_starting_the_endpoint_forwarder_would_run_the_repository_on_the_worker(
    tmp_path: Path, canary: Path
) -> None:
    repo = hostile_repo(tmp_path, canary)
    checkout = tmp_path / "checkout"
    git("clone", "-q", str(repo.bare), str(checkout))
    env = {"PATH": os.environ["PATH"]}
    subprocess.run(
        [sys.executable, "-m", "environments.endpoint_forwarder"], cwd=checkout, env=env, capture_output=True
    )
    assert canary.read_text().startswith("environments/__init__.py")  # the attack the fix stops is real


def test_the_endpoint_forwarder_imports_nothing_of_the_workspace_and_still_forwards(
    tmp_path: Path, canary: Path, serve: Serve
) -> None:
    repo = hostile_repo(tmp_path, canary)
    server = serve(CART_SCRIPTS / "mini-swe-agent-fix.yaml")
    probe = (
        "import json, os, urllib.request\n"
        "req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', data=json.dumps("
        "{'model': 'x', 'messages': [{'role': 'system', 'content': 'mswea_bash_command'},"
        " {'role': 'user', 'content': 'Cart total is wrong'}]}).encode(), headers={"
        "'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'], 'Content-Type': 'application/json'})\n"
        "answer = json.load(urllib.request.urlopen(req))\n"
        "open('answer.json', 'w').write(json.dumps({'model': answer['model']}))\n"
    )
    (tmp_path / "probe.py").write_text(probe)
    # -I inside too: the probe's own imports are the sandbox's business, not what this test measures.
    acts = engine(tmp_path, server, ShellAgent(f"/usr/bin/python3 -I {tmp_path / 'probe.py'}", read_only=(tmp_path,)))

    proposal = activity_env().run(acts.agent_command, attempt_input(acts, repo))

    patch = acts.store.read_bytes(proposal.patch_ref).decode()
    assert proposal.files_changed == ["answer.json"]
    answer = json.loads("".join(line[1:] for line in patch.splitlines() if line.startswith("+{")))
    assert answer == {"model": MODEL}  # the request went through the forwarder and was answered
    assert not canary.exists(), canary.read_text()


def test_the_app_forwarder_and_bwrap_import_nothing_of_the_workspace(tmp_path: Path, canary: Path) -> None:
    repo = hostile_repo(tmp_path, canary)
    mgr = WorkspaceManager(cache_dir=tmp_path / "cache", root=tmp_path / "workspaces")
    run = "repair:acme/shop#1"
    ws = mgr.rebuild(run_id=run, op_id=f"{run}:env", clone_url=repo.url, base_revision=repo.base)
    spec = build_recovery_spec("acme/shop", repo.url, repo.base, ws.path)
    provider = LocalProcessProvider(tmp_path / "environments", sandbox=Sandbox.detect(), stop_grace_s=2.0)
    try:
        handle = provider.provision(run_id=run, op_id=f"{run}:env", spec=spec, workspace=str(ws.path))
        with urllib.request.urlopen(f"{handle.base_url}/healthz", timeout=10) as answer:
            assert answer.status == 200  # the app answers through its forwarder
        provider.teardown(handle)
    finally:
        provider.cleanup_run(run)
        mgr.cleanup_run(run)
    assert not canary.exists(), canary.read_text()
