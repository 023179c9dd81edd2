"""The mirror cache against a real smart-HTTP git remote: failures are classified, and a mirror whose fetch
fails is replaced by a fresh clone once, without losing what workspaces built on it stand on."""

from __future__ import annotations

import pickle
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from environments.git import (
    GitError,
    GitProtocolError,
    GitTransportError,
    classify_failure,
    git_env,
    has_commit,
    run_git,
)
from environments.mirror import MirrorCache, RevisionNotFoundError
from environments.ports import free_port
from environments.workspace import WorkspaceManager
from tests.support.git_http import TOKEN, GitHttpServer
from tests.support.gitrepo import Repo, git
from tests.support.served import accepting

RUN = "repair:acme/cart#7"


@pytest.fixture
def url(server: GitHttpServer, repo: Repo) -> str:
    return server.url(repo.bare.name)


def _failure(args: list[str], **kwargs: object) -> GitError:
    with pytest.raises(GitError) as raised:
        run_git(args, **kwargs)  # type: ignore[arg-type]
    return raised.value


@pytest.fixture
def hangs_up() -> Iterator[str]:
    """A URL whose server accepts every connection and closes it without answering."""

    def hang_up(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.close()

    with accepting(hang_up) as port:
        yield f"http://127.0.0.1:{port}/gone.git"


# --- classification, from what real git prints ---------------------------------------------------------------


def mirrored_before_a_push(tmp_path: Path, repo: Repo, url: str) -> tuple[MirrorCache, Path, str]:
    """A mirror cache holding ``url`` at the base, and a commit pushed after it: the cache, the mirror, the commit."""
    cache = MirrorCache(tmp_path / "cache")
    mirror = cache.ensure(url, repo.base, token=TOKEN)
    return cache, mirror, repo.push_commit("NOTES.md", "later\n", "a later commit")


def test_a_wrong_token_is_a_protocol_error(url: str) -> None:
    err = _failure(["ls-remote", url], env=git_env(clone_url=url, token="ghs_revoked"))
    assert type(err) is GitProtocolError


def test_a_missing_repository_is_a_protocol_error(server: GitHttpServer) -> None:
    missing = server.url("nothing-here.git")
    err = _failure(["ls-remote", missing], env=git_env(clone_url=missing, token=TOKEN))
    assert type(err) is GitProtocolError and "not found" in err.stderr


def test_a_forbidden_answer_is_a_protocol_error_with_its_status(url: str, server: GitHttpServer) -> None:
    server.fail_next(1, status=403, path="/info/refs")
    err = _failure(["ls-remote", url], env=git_env(clone_url=url, token=TOKEN))
    assert type(err) is GitProtocolError and err.http_status == 403


def test_a_commit_the_server_will_not_serve_is_a_protocol_error(tmp_path: Path, url: str) -> None:
    env = git_env(clone_url=url, token=TOKEN)
    run_git(["clone", "--quiet", "--mirror", url, str(tmp_path / "m.git")], env=env)
    err = _failure(["fetch", "origin", "0" * 39 + "1:refs/x"], cwd=tmp_path / "m.git", env=env)
    assert type(err) is GitProtocolError and "not our ref" in err.stderr


def test_a_server_error_is_a_transport_error_with_its_status(url: str, server: GitHttpServer) -> None:
    server.fail_next(1, status=502, path="/info/refs")
    err = _failure(["ls-remote", url], env=git_env(clone_url=url, token=TOKEN))
    assert type(err) is GitTransportError and err.http_status == 502


def test_a_refused_connection_and_an_empty_reply_are_transport_errors(hangs_up: str) -> None:
    refused = _failure(["ls-remote", f"http://127.0.0.1:{free_port()}/x.git"])
    empty = _failure(["ls-remote", hangs_up])
    assert type(refused) is GitTransportError and type(empty) is GitTransportError
    assert "Empty reply" in empty.stderr


def test_a_local_failure_is_a_plain_git_error(tmp_path: Path) -> None:
    err = _failure(["rev-parse", "HEAD"], cwd=tmp_path)
    assert type(err) is GitError and err.http_status is None


@pytest.mark.parametrize(
    ("stderr", "expected", "status"),
    [
        (
            "error: RPC failed; HTTP 403 curl 22 The requested URL returned error: 403\nfatal: the remote end hung up "
            "unexpectedly",
            GitProtocolError,
            403,
        ),
        (
            "error: RPC failed; curl 52 Empty reply from server\nfatal: protocol error: bad pack header",
            GitTransportError,
            None,
        ),
        ("fatal: protocol error: bad line length character: HTTP", GitProtocolError, None),
        ("fatal: unable to access 'https://h/x.git/': The requested URL returned error: 429", GitTransportError, 429),
        ("fatal: unable to access 'https://h/openssl.git/': Could not resolve host: h", GitTransportError, None),
        ("fatal: not a git repository: '/cache/openssl.git'", GitError, None),
    ],
    ids=["http-403-then-hangup", "curl-then-protocol-error", "protocol-error", "429", "dns", "local-ssl-in-path"],
)
def test_classification_puts_the_status_first_and_symptoms_of_a_broken_transfer_before_protocol_errors(
    stderr: str, expected: type[GitError], status: int | None
) -> None:
    assert classify_failure(stderr) == (expected, status)


def test_git_errors_survive_pickling_with_their_class_and_fields(url: str, server: GitHttpServer) -> None:
    server.fail_next(1, status=403, path="/info/refs")
    err = _failure(["ls-remote", url], env=git_env(clone_url=url, token=TOKEN))
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is GitProtocolError
    assert (copy.args_run, copy.returncode, copy.stderr, copy.http_status) == (
        err.args_run,
        err.returncode,
        err.stderr,
        403,
    )
    assert str(copy) == str(err)


# --- a failed fetch into an existing mirror ---------------------------------------------------------------------


def _leftovers(cache: MirrorCache) -> list[str]:
    return sorted(p.name for p in cache.mirrors_dir.iterdir() if p.name.startswith(".") and p.is_dir())


def test_a_mirror_whose_fetch_fails_locally_is_cloned_again(tmp_path: Path, repo: Repo, url: str) -> None:
    cache, mirror, newer = mirrored_before_a_push(tmp_path, repo, url)
    # A worker killed mid-fetch leaves ref locks behind; every later fetch into that mirror fails on them.
    (mirror / "refs" / "heads").mkdir(parents=True, exist_ok=True)
    (mirror / "refs" / "heads" / "main.lock").write_text("")

    assert cache.ensure(url, newer, token=TOKEN) == mirror

    assert has_commit(mirror, newer) and has_commit(mirror, repo.base)
    assert not (mirror / "refs" / "heads" / "main.lock").exists()
    assert run_git(["rev-parse", "refs/heads/main"], cwd=mirror) == newer
    assert run_git(["config", "gc.pruneExpire"], cwd=mirror) == "never"
    assert cache.last_used(mirror)[1], "the fresh mirror is stamped as used"
    assert _leftovers(cache) == []


def test_a_fetch_the_server_drops_is_answered_by_one_fresh_clone(
    tmp_path: Path, repo: Repo, url: str, server: GitHttpServer
) -> None:
    cache, mirror, newer = mirrored_before_a_push(tmp_path, repo, url)
    server.fail_next(1, status=None)

    cache.ensure(url, newer, token=TOKEN)

    assert server.failed_requests == 1 and has_commit(mirror, newer)
    assert _leftovers(cache) == []


def test_when_the_fresh_clone_fails_too_its_error_is_raised_and_the_old_mirror_stays(
    tmp_path: Path, repo: Repo, url: str, server: GitHttpServer
) -> None:
    cache, mirror, newer = mirrored_before_a_push(tmp_path, repo, url)
    server.fail_next(2, status=503)

    with pytest.raises(GitTransportError) as raised:
        cache.ensure(url, newer, token=TOKEN)

    assert server.failed_requests == 2, "one fetch and one clone, nothing more"
    assert raised.value.http_status == 503 and isinstance(raised.value.__cause__, GitTransportError)
    assert has_commit(mirror, repo.base) and not has_commit(mirror, newer)
    assert _leftovers(cache) == []
    # Once the remote answers again, the same mirror catches up.
    assert cache.ensure(url, newer, token=TOKEN) == mirror and has_commit(mirror, newer)


def test_a_revoked_token_is_a_protocol_error_after_one_clone_attempt(
    tmp_path: Path, repo: Repo, url: str, server: GitHttpServer
) -> None:
    cache, mirror, newer = mirrored_before_a_push(tmp_path, repo, url)
    server.accept_token("ghs_the-new-token")
    refused_before = server.refused_requests

    with pytest.raises(GitProtocolError):
        cache.ensure(url, newer, token=TOKEN)

    assert server.refused_requests - refused_before == 2
    assert has_commit(mirror, repo.base)


def test_a_commit_the_remote_lacks_is_not_found_but_an_unreachable_remote_is_transient(
    tmp_path: Path, repo: Repo, url: str, server: GitHttpServer
) -> None:
    cache = MirrorCache(tmp_path / "cache")
    cache.ensure(url, repo.base, token=TOKEN)
    unknown = "0" * 39 + "1"
    with pytest.raises(RevisionNotFoundError):
        cache.ensure(url, unknown, token=TOKEN)

    # How many upload-pack requests the (up to date) fetch of all refs makes; the one after them is the
    # fetch of the commit by its ID, and that one meets a dropped connection.
    before = len(server.paths)
    run_git(["fetch", "--quiet", "origin"], cwd=cache.path_for(url), env=git_env(clone_url=url, token=TOKEN))
    refresh = sum(path.endswith("/git-upload-pack") for path in server.paths[before:])
    server.fail_next(1, status=None, skip=refresh)
    with pytest.raises(GitTransportError):
        cache.ensure(url, unknown, token=TOKEN)
    assert server.failed_requests == 1


def test_workspaces_built_on_the_old_mirror_keep_every_object_after_the_fresh_clone(
    tmp_path: Path, repo: Repo, url: str
) -> None:
    mgr = WorkspaceManager(tmp_path / "cache", tmp_path / "root")
    first = repo.push_commit("EXTRA.md", "soon rewritten\n", "a commit the remote will drop")
    ws = mgr.rebuild(run_id=RUN, op_id=f"{RUN}:a", clone_url=url, base_revision=first, token=TOKEN)
    # Restored from a bundle only: never on the remote.
    local_only = git("commit-tree", "-p", first, "-m", "unpublished", f"{first}^{{tree}}", cwd=repo.work)
    git("update-ref", "refs/heads/side", local_only, cwd=repo.work)
    git("bundle", "create", str(tmp_path / "b.bundle"), "refs/heads/side", f"^{first}", cwd=repo.work)
    mgr.mirrors.ensure(url, local_only, token=TOKEN, bundle=tmp_path / "b.bundle")
    # The remote forgets `first`, and the mirror's next fetch fails on a stale lock: the mirror is re-cloned.
    git("reset", "-q", "--hard", repo.base, cwd=repo.work)
    (repo.work / "NOTES.md").write_text("rewritten\n")
    git("add", "NOTES.md", cwd=repo.work)
    git("commit", "-q", "-m", "history rewritten", cwd=repo.work)
    newer = git("rev-parse", "HEAD", cwd=repo.work)
    git("push", "-q", "--force", "origin", "HEAD:main", cwd=repo.work)
    git("gc", "-q", "--prune=now", cwd=repo.bare)
    assert not has_commit(repo.bare, first)
    mirror = mgr.mirrors.path_for(url)
    (mirror / "refs" / "heads" / "main.lock").parent.mkdir(parents=True, exist_ok=True)
    (mirror / "refs" / "heads" / "main.lock").write_text("")

    mgr.mirrors.ensure(url, newer, token=TOKEN)

    assert not (mirror / "refs" / "heads" / "main.lock").exists()
    assert all(has_commit(mirror, sha) for sha in (first, local_only, newer))
    assert run_git(["rev-parse", f"refs/durafix/bundles/{local_only}"], cwd=mirror) == local_only
    git("fsck", "--connectivity-only", "--no-dangling", cwd=ws.path)
    assert git("rev-parse", "HEAD", cwd=ws.path) == first
    assert git("log", "--format=%s", "-1", cwd=ws.path) == "a commit the remote will drop"
