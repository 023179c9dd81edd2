"""Fixtures of this folder, from :mod:`tests.support.e2e_stack`."""

from tests.support.e2e_stack import e2e_stack, stack_with_worker, workers_stopped

__all__ = ["e2e_stack", "stack_with_worker", "workers_stopped"]
