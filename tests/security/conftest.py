"""Fixtures of the security tests that need Chromium."""

from tests.support.chromium import chromium, runner

__all__ = ["chromium", "runner"]
