from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.gitrepo import Repo, make_repo


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return make_repo(tmp_path / "repo")
