"""A forge process killed with SIGKILL and restarted on the same data dir has lost nothing it acknowledged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from github import Auth, Github

from tests.support.forge import Receiver, branch_with, git

ROOT = Path(__file__).resolve().parents[3]
ADMIN = "admin-token-for-tests"


@contextmanager
def forge_process(data_dir: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``python -m infra.forge serve`` on a free port; yields the process and its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.forge", "serve", "--port", "0", "--data-dir", str(data_dir)],
        cwd=ROOT,
        env={**os.environ, "DURAFIX_FORGE_ADMIN_TOKEN": ADMIN},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("forge: serving "), line + (proc.stderr.read() if proc.stderr else "")
        yield proc, line.split()[-1]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _admin(base: str, path: str, body: dict[str, object]) -> dict[str, object]:
    resp = httpx.post(f"{base}/api/v3{path}", json=body, headers={"Authorization": f"token {ADMIN}"})
    resp.raise_for_status()
    result: dict[str, object] = resp.json()
    return result


def _gh(base: str, token: str) -> Github:
    return Github(
        base_url=f"{base}/api/v3",
        auth=Auth.Token(token),
        retry=None,
        seconds_between_requests=None,
        seconds_between_writes=None,
    )


def test_state_survives_kill_9_and_restart(tmp_path: Path, receiver: Receiver) -> None:
    data = tmp_path / "data"
    with forge_process(data) as (proc, base):
        _admin(base, "/admin/users", {"login": "alice", "email": "alice@example.com"})
        _admin(base, "/admin/users", {"login": "bob", "email": "bob@example.com"})
        alice = str(_admin(base, "/admin/users/alice/authorizations", {})["token"])
        bob = str(_admin(base, "/admin/users/bob/authorizations", {})["token"])
        gh = _gh(base, alice)
        repo = gh.get_user().create_repo("shop", auto_init=True)
        repo.add_to_collaborators("bob", "push")
        hook = repo.create_hook("web", {"url": receiver.url, "content_type": "json", "secret": "x"}, ["*"])
        issue = repo.create_issue("bug", body="broken", labels=["bug"])
        comment = issue.create_comment("seen")
        claim = repo.create_git_ref("refs/durafix/claims/run-1", repo.get_branch("main").commit.sha)
        wc = tmp_path / "wc"
        git("clone", "-q", f"{base.replace('://', f'://x:{alice}@')}/alice/shop.git", str(wc))
        git("checkout", "-q", "-b", "fix", cwd=wc)
        (wc / "fix.txt").write_text("fix\n")
        git("add", "fix.txt", cwd=wc)
        git("commit", "-qm", "fix", cwd=wc)
        git("push", "-q", "origin", "fix", cwd=wc)
        head = git("rev-parse", "HEAD", cwd=wc).stdout.strip()
        pull = repo.create_pull(title="Fix", body="", head="fix", base="main", draft=True)
        review = _gh(base, bob).get_repo("alice/shop").get_pull(pull.number).create_review(body="ok", event="APPROVE")
        branch_with(repo, "other", {"o.txt": "o\n"})
        deadline = time.monotonic() + 20
        while any(d.status == "pending" for d in repo.get_hook_deliveries(hook.id)):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        delivered = [(d.guid, d.event, d.status_code) for d in repo.get_hook_deliveries(hook.id)]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    with forge_process(data) as (_, base2):
        assert base2 != "" and httpx.get(f"{base2}/api/v3/user", headers={"Authorization": f"token {bob}"}).is_success
        repo2 = _gh(base2, alice).get_repo("alice/shop")
        assert repo2.get_branch("fix").commit.sha == head
        assert repo2.get_git_ref("durafix/claims/run-1").object.sha == claim.object.sha
        assert {b.name for b in repo2.get_branches()} == {"main", "fix", "other"}
        issue2 = repo2.get_issue(issue.number)
        assert (issue2.title, issue2.body, [label.name for label in issue2.labels]) == ("bug", "broken", ["bug"])
        assert [(c.id, c.body) for c in issue2.get_comments()] == [(comment.id, "seen")]
        pull2 = repo2.get_pull(pull.number)
        assert (pull2.head.sha, pull2.draft, pull2.state) == (head, True, "open")
        assert [(r.id, r.state, r.commit_id) for r in pull2.get_reviews()] == [(review.id, "APPROVED", head)]
        assert repo2.get_collaborator_permission("bob") == "write"
        assert [(d.guid, d.event, d.status_code) for d in repo2.get_hook_deliveries(hook.id)] == delivered
        fresh = tmp_path / "fresh"
        git("clone", "-q", "-b", "fix", f"{base2}/alice/shop.git", str(fresh))
        assert (fresh / "fix.txt").read_text() == "fix\n"


def test_sigterm_stops_the_server_cleanly(tmp_path: Path) -> None:
    with forge_process(tmp_path / "data") as (proc, base):
        assert httpx.get(f"{base}/api/v3/users/nobody").status_code == 404
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
