"""Host affinity: the steps that reach a running environment run on the host that holds it.

An environment's app answers on its host's loopback only (the local provider binds 127.0.0.1; a Docker
provider's containers are reachable from their engine's host), so a reproduction, a teardown or a host's share
of a run's cleanup must run *there*, not on any worker of the browser or environments queue. Every worker that
serves both the environments and the browser queue therefore also polls its host's own queue
(:func:`host_queue`), and stamps that queue on the environments it provisions (``EnvironmentHandle.host``);
the workflow sends the steps in :data:`HOST_STEPS` for such an environment to it.

A host that is gone (dead, or cut off from the network) never picks its queue's tasks up: those steps carry a
schedule-to-start timeout (``RunPolicy.host_start_s``), after which the workflow treats the environment as
gone and provisions it anew on whatever host the environments queue hands it to. A host that comes back finds
its late completions refused (the attempts were timed out) and the run's tombstone in the shared store.

The host's identity is ``DURAFIX_HOST_ID`` (default: the host name): two worker processes on one host share
it, so either serves the host's queue; two hosts must differ (containers and pods have their own host names).
"""

from __future__ import annotations

import re
import socket

from pipeline import steps

HOST_QUEUE_PREFIX = "durafix-host-"
# What runs on the host holding the environment; everything else goes to its capability's queue.
HOST_STEPS = (steps.REPRODUCE, steps.REPRODUCE_IN_ENVIRONMENT, steps.TEARDOWN, steps.CLEANUP_RUN)


def host_id(configured: str = "") -> str:
    """This host's identity: the configured one, else the host name."""
    return configured or socket.gethostname()


def host_queue(host: str) -> str:
    """The task queue of host ``host``: a task queue name holds letters, digits and ``.-_`` here."""
    return HOST_QUEUE_PREFIX + re.sub(r"[^A-Za-z0-9._-]", "-", host)


def serves_host_queue(queues: object) -> bool:
    """Whether a worker polling ``queues`` holds environments its own browser can reach (both queues)."""
    return steps.TaskQueue.ENVIRONMENTS in queues and steps.TaskQueue.BROWSER in queues  # type: ignore[operator]
