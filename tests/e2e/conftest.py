"""Fixtures of this folder, from :mod:`tests.support.e2e_stack` and :mod:`tests.e2e.review_runs`."""

from tests.e2e.review_runs import opened
from tests.support.e2e_stack import e2e_stack, stack_with_worker, workers_stopped

__all__ = ["e2e_stack", "opened", "stack_with_worker", "workers_stopped"]
