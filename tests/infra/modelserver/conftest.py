from tests.support.modelserver import serve

__all__ = ["serve"]
