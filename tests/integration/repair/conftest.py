from tests.support.gitrepo import repo
from tests.support.modelserver import serve
from tests.support.repair import cart_repo

__all__ = ["cart_repo", "repo", "serve"]
