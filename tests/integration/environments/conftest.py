from __future__ import annotations

from tests.support.git_http import server
from tests.support.gitrepo import repo

__all__ = ["repo", "server"]
