"""Fixtures of the security tests: Chromium, the receiver's trust harness (forge, config, receiver, site) and
the whole stack; a module defining a fixture of the same name uses its own."""

from tests.support.chromium import chromium, runner
from tests.support.e2e_stack import e2e_stack, stack_with_worker, workers_stopped
from tests.support.gitrepo import repo
from tests.support.security_harness import config, forge, receiver, site

__all__ = [
    "chromium",
    "config",
    "e2e_stack",
    "forge",
    "receiver",
    "repo",
    "runner",
    "site",
    "stack_with_worker",
    "workers_stopped",
]
