"""The bubblewrap sandbox for the tests that run code in it: skipped locally, failed under CI, when bubblewrap
cannot run here (the reason is bubblewrap's own)."""

from __future__ import annotations

import pytest

from environments.sandbox import Sandbox, bwrap_problem
from tests.conftest import unavailable


def require_bubblewrap() -> None:
    """Stop the test (skip, or fail under CI) when bubblewrap is missing or cannot make a namespace here."""
    problem = bwrap_problem()
    if problem is not None:
        unavailable(problem)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    require_bubblewrap()
    return Sandbox.detect()
