from tests.modelserver.support import serve

__all__ = ["serve"]
