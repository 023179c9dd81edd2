from __future__ import annotations

from tests.support.gitrepo import repo

__all__ = ["repo"]
