from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from evidence.local import LocalArtifactStore
from tests.conftest import require
from tests.support.chromium import chromium
from tests.support.git_http import GitHttpServer
from tests.support.gitrepo import Repo, make_repo, repo
from tests.support.recovery_workers import TOKEN, Remote, Worker
from tests.support.stepped import StoredCart, stored_cart_run

__all__ = ["chromium", "evidence_dir", "new_worker", "remote", "repo"]


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[Remote]:
    require(shutil.which("git") is not None, "git is not installed")
    repo = make_repo(tmp_path / "repo")
    with GitHttpServer(repo.bare.parent, TOKEN) as server:
        yield Remote(repo=repo, server=server)


@pytest.fixture
def evidence_dir(tmp_path: Path) -> Path:
    return tmp_path / "evidence"


@pytest.fixture
def cart(repo: Repo, evidence_dir: Path) -> StoredCart:
    """The cart run of ``repo`` stored in an evidence store on ``evidence_dir``."""
    store = LocalArtifactStore(evidence_dir)
    return StoredCart(evidence_dir, store, *stored_cart_run(store, repo))


@pytest.fixture
def new_worker(tmp_path: Path, evidence_dir: Path) -> Iterator[Callable[[str], Worker]]:
    """Start a worker on state directory ``tmp_path/<name>``; every worker is shut down at teardown."""
    started: list[Worker] = []

    def start(name: str) -> Worker:
        worker = Worker(tmp_path / name, evidence_dir)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.close()
