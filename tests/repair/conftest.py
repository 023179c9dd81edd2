from tests.modelserver.support import serve
from tests.repair.support import cart_repo

__all__ = ["cart_repo", "serve"]
