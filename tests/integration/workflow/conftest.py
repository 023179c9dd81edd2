"""Fixtures of this folder: the scripted model server (tests.support.modelserver)."""

from tests.support.modelserver import serve

__all__ = ["serve"]
