"""Git over smart HTTP with the real git CLI: clone, push, fetch, auth, large chunked pushes, name checks."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest
from github import GithubException

from tests.support.forge import GIT_ENV, Team, branch_with, git


def _clone(team: Team, tmp_path: Path, token: str | None, name: str = "wc", repo: str = "alice/shop") -> Path:
    dest = tmp_path / name
    git("clone", "-q", team.forge.clone_url(repo, token), str(dest))
    return dest


def _commit(wc: Path, path: str, content: bytes, message: str) -> str:
    (wc / path).write_bytes(content)
    git("add", path, cwd=wc)
    git("commit", "-q", "-m", message, cwd=wc)
    return git("rev-parse", "HEAD", cwd=wc).stdout.strip()


def test_clone_speaks_protocol_v2(team: Team, tmp_path: Path) -> None:
    result = git(
        "-c", "protocol.version=2", "ls-remote", team.forge.clone_url("alice/shop"), env={"GIT_TRACE_PACKET": "1"}
    )
    assert "version 2" in result.stderr
    assert "refs/heads/main" in result.stdout
    wc = _clone(team, tmp_path, None)
    assert (wc / "README.md").read_text().startswith("# shop")


def test_pushed_branch_is_visible_through_the_api(team: Team, tmp_path: Path) -> None:
    wc = _clone(team, tmp_path, team.bob)
    git("checkout", "-q", "-b", "fix", cwd=wc)
    sha = _commit(wc, "fix.txt", b"fixed\n", "fix")
    git("push", "-q", "origin", "fix", cwd=wc)
    assert team.shop.get_branch("fix").commit.sha == sha
    assert team.shop.get_git_ref("heads/fix").object.sha == sha


def test_push_to_a_pull_request_head_updates_the_pull(team: Team, tmp_path: Path) -> None:
    repo = team.shop
    branch_with(repo, "topic", {"t.txt": "1\n"})
    pull = repo.create_pull(title="t", body="", head="topic", base="main")
    wc = _clone(team, tmp_path, team.alice)
    git("checkout", "-q", "topic", cwd=wc)
    sha = _commit(wc, "t.txt", b"2\n", "second")
    git("push", "-q", "origin", "topic", cwd=wc)
    assert repo.get_pull(pull.number).head.sha == sha
    assert git("ls-remote", team.forge.clone_url("alice/shop"), f"refs/pull/{pull.number}/head").stdout.startswith(sha)


def test_large_push_uses_chunked_transfer_and_arrives_intact(team: Team, tmp_path: Path) -> None:
    wc = _clone(team, tmp_path, team.alice)
    payload = os.urandom(3 * 1024 * 1024)
    sha = _commit(wc, "big.bin", payload, "big")
    pushed = git("-c", "http.postBuffer=65536", "push", "origin", "main", cwd=wc, env={"GIT_TRACE_CURL": "1"})
    assert "Transfer-Encoding: chunked" in pushed.stderr
    assert team.shop.get_branch("main").commit.sha == sha
    fresh = _clone(team, tmp_path, None, name="fresh")
    assert (fresh / "big.bin").read_bytes() == payload


def test_fetch_brings_server_side_merges(team: Team, tmp_path: Path) -> None:
    wc = _clone(team, tmp_path, team.alice)
    repo = team.shop
    head = branch_with(repo, "srv", {"s.txt": "s\n"})
    merged = repo.create_pull(title="s", body="", head="srv", base="main").merge(sha=head)
    git("-c", "protocol.version=2", "fetch", "-q", "origin", cwd=wc)
    assert git("rev-parse", "origin/main", cwd=wc).stdout.strip() == merged.sha


def test_anonymous_push_is_challenged_with_basic_auth(team: Team) -> None:
    url = f"{team.forge.base_url}/alice/shop.git/info/refs?service=git-receive-pack"
    resp = httpx.get(url)
    assert resp.status_code == 401
    assert resp.headers["www-authenticate"].startswith("Basic")
    assert httpx.get(url, auth=("x-access-token", team.bob)).status_code == 200


def test_reader_push_is_403_and_bad_token_is_401(team: Team) -> None:
    url = f"{team.forge.base_url}/alice/shop.git/info/refs?service=git-receive-pack"
    assert httpx.get(url, auth=("x-access-token", team.carol)).status_code == 403
    assert httpx.get(url, auth=("x-access-token", "wrong")).status_code == 401


def test_private_repository_needs_credentials_and_hides_from_outsiders(team: Team, tmp_path: Path) -> None:
    team.forge.create_repo(team.alice, "vault", private=True)
    url = f"{team.forge.base_url}/alice/vault.git/info/refs?service=git-upload-pack"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, auth=("x", team.carol)).status_code == 404
    wc = _clone(team, tmp_path, team.alice, repo="alice/vault")
    assert (wc / "README.md").exists()


@pytest.mark.parametrize(
    "path",
    [
        "/../../etc/passwd.git/info/refs",
        "/alice/..%2F..%2Fshop.git/info/refs",
        "/alice/../shop.git/info/refs",
        "/alice/shop.git/../../forge.sqlite3",
        "/alice/shop.git/objects/../../../forge.sqlite3",
        "/.hidden/shop.git/info/refs",
    ],
)
def test_paths_escaping_the_data_dir_are_refused(team: Team, path: str) -> None:
    resp = httpx.get(f"{team.forge.base_url}{path}?service=git-upload-pack", auth=("x", team.alice))
    assert resp.status_code == 404
    assert b"SQLite" not in resp.content


@pytest.mark.parametrize("name", ["..", "../evil", "a/b", "evil.git", ".", "with space"])
def test_repository_names_that_could_escape_are_422(team: Team, name: str) -> None:
    with pytest.raises(GithubException) as err:
        team.gh(team.alice).get_user().create_repo(name)
    assert err.value.status == 422


@pytest.mark.parametrize(
    "ref",
    [
        "refs/heads/../x",
        "refs/heads/a..b",
        "refs/x",
        "heads/x",
        "refs/heads/x.lock",
        "refs//heads/x",
        "refs/heads/-x/../../y",
    ],
)
def test_ref_names_git_would_reject_are_422(team: Team, ref: str) -> None:
    repo = team.shop
    with pytest.raises(GithubException) as err:
        repo.create_git_ref(ref, repo.get_branch("main").commit.sha)
    assert err.value.status == 422


def test_pushing_a_pull_head_into_its_base_marks_the_pull_merged(team: Team, tmp_path: Path) -> None:
    repo = team.shop
    head = branch_with(repo, "manual", {"m.txt": "m\n"})
    pull = repo.create_pull(title="manual", body="", head="manual", base="main")
    wc = _clone(team, tmp_path, team.alice)
    git("fetch", "-q", "origin", "manual", cwd=wc)
    git("merge", "-q", "--ff-only", "FETCH_HEAD", cwd=wc)
    git("push", "-q", "origin", "main", cwd=wc)
    merged = repo.get_pull(pull.number)
    assert (merged.merged, merged.state, merged.merge_commit_sha) == (True, "closed", head)


def _tagged_history(wc: Path, start: int, count: int) -> None:
    """Append ``count`` commits to ``main`` of ``wc``, each changing its own file and tagged ``vN``."""
    script = []
    for n in range(start, start + count):
        message = f"commit {n}\n".encode()
        content = f"line {n}\n".encode() * 20
        script += [
            b"commit refs/heads/main",
            f"mark :{n}".encode(),
            f"committer Dev <dev@example.com> {1_700_000_000 + n} +0000".encode(),
            f"data {len(message)}".encode(),
            message,
        ]
        if n == start and start > 1:
            script.append(b"from refs/heads/main^0")
        script += [f"M 100644 inline f{n}.txt".encode(), f"data {len(content)}".encode(), content]
        script += [f"reset refs/tags/v{n}".encode(), f"from :{n}".encode(), b""]
    subprocess.run(
        ["git", "fast-import", "--quiet"],
        cwd=wc,
        input=b"\n".join(script) + b"\n",
        check=True,
        env={**os.environ, **GIT_ENV},
    )


def _refs(repo: Path) -> dict[str, str]:
    listing = git("for-each-ref", "--format=%(refname) %(objectname)", cwd=repo).stdout
    return {name: sha for name, sha in (line.split(" ", 1) for line in listing.splitlines())}


def test_mirror_clone_and_fetch_of_a_long_tagged_history_send_gzip_bodies(team: Team, tmp_path: Path) -> None:
    team.forge.create_repo(team.alice, "history", auto_init=False)
    url = team.forge.clone_url("alice/history", team.alice)
    author = tmp_path / "author"
    git("init", "-q", "-b", "main", str(author))
    _tagged_history(author, 1, 60)
    git("push", "-q", url, "refs/heads/main:refs/heads/main", "refs/tags/*:refs/tags/*", cwd=author)

    mirror = tmp_path / "mirror.git"
    cloned = git("clone", "--mirror", url, str(mirror), env={"GIT_TRACE_CURL": "1", "GIT_TRACE_CURL_NO_DATA": "1"})
    assert "Content-Encoding: gzip" in cloned.stderr
    assert _refs(mirror) == _refs(author) and len(_refs(mirror)) == 61

    _tagged_history(author, 61, 40)
    git("push", "-q", url, "refs/heads/main:refs/heads/main", "refs/tags/*:refs/tags/*", cwd=author)
    fetched = git("fetch", "origin", cwd=mirror, env={"GIT_TRACE_CURL": "1", "GIT_TRACE_CURL_NO_DATA": "1"})
    assert "Content-Encoding: gzip" in fetched.stderr
    assert _refs(mirror) == _refs(author) and len(_refs(mirror)) == 101
    git("fsck", "--connectivity-only", cwd=mirror)


def test_a_push_with_a_lease_is_a_compare_and_swap_on_a_ref_outside_branches(team: Team, tmp_path: Path) -> None:
    # What claim refs rely on: a parentless commit with git's empty tree, pushed to refs/durafix/... with
    # --force-with-lease, lands only where the ref is what the lease says, and reads back over REST.
    wc = _clone(team, tmp_path, team.bob)
    empty_tree = git("hash-object", "-t", "tree", os.devnull, cwd=wc).stdout.strip()
    first, second, third = (git("commit-tree", empty_tree, "-m", f"claim {n}", cwd=wc).stdout.strip() for n in range(3))
    ref = "refs/durafix/claims/ticket/op-1"

    def push(sha: str, expected: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "push", "--porcelain", f"--force-with-lease={ref}:{expected}", "origin", f"{sha}:{ref}"],
            cwd=wc,
            env=GIT_ENV,
            capture_output=True,
            text=True,
            check=False,
        )

    assert push(first, "").returncode == 0
    assert push(second, "").returncode != 0  # must not exist: it does
    assert push(third, second).returncode != 0  # a lease on a value the ref never had
    assert team.shop.get_git_ref("durafix/claims/ticket/op-1").object.sha == first
    assert push(second, first).returncode == 0
    assert team.shop.get_git_ref("durafix/claims/ticket/op-1").object.sha == second
    assert team.shop.get_git_commit(second).message.startswith("claim 1")
