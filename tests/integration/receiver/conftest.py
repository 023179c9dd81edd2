"""Fixtures of the receiver's tests: the trust harness (forge, config, receiver, site) and the whole stack; a
module defining a fixture of the same name (``test_webhooks``) uses its own."""

from tests.support.e2e_stack import e2e_stack, stack_with_worker, workers_stopped
from tests.support.security_harness import config, forge, receiver, site

__all__ = ["config", "e2e_stack", "forge", "receiver", "site", "stack_with_worker", "workers_stopped"]
