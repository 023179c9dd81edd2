from __future__ import annotations

import base64
from pathlib import Path

import pytest

from environments.git import GitError
from environments.workspace import WorkspaceManager
from tests.support.git_http import TOKEN, GitHttpServer
from tests.support.gitrepo import Repo

RUN = "repair:acme/cart#12"


def files_containing(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_the_token_authenticates_clone_and_fetch_without_reaching_disk(
    tmp_path: Path, repo: Repo, server: GitHttpServer
) -> None:
    mgr = WorkspaceManager(tmp_path / "cache", tmp_path / "root")
    url = server.url(repo.bare.name)
    ws = mgr.rebuild(run_id=RUN, op_id=f"{RUN}:a", clone_url=url, base_revision=repo.base, token=TOKEN)
    newer = repo.push_commit("NOTES.md", "later\n", "a later commit")
    mgr.rebuild(run_id=RUN, op_id=f"{RUN}:b", clone_url=url, base_revision=newer, token=TOKEN)

    assert (ws.path / "app.py").is_file()
    assert server.authorized_requests >= 2
    header = base64.b64encode(f"x-access-token:{TOKEN}".encode())
    for needle in (TOKEN.encode(), header):
        assert files_containing(tmp_path / "cache", needle) == []
        assert files_containing(tmp_path / "root", needle) == []


def test_without_the_token_the_clone_fails_and_leaves_no_mirror(
    tmp_path: Path, repo: Repo, server: GitHttpServer
) -> None:
    mgr = WorkspaceManager(tmp_path / "cache", tmp_path / "root")
    with pytest.raises(GitError):
        mgr.rebuild(run_id=RUN, op_id=f"{RUN}:a", clone_url=server.url(repo.bare.name), base_revision=repo.base)
    assert server.refused_requests >= 1
    assert [p for p in (tmp_path / "cache" / "mirrors").iterdir() if p.is_dir()] == []
