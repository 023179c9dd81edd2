"""A real ``durafix worker`` (supervised, every production activity) that also serves ``probe.hold`` on the model
queue: a heartbeating activity that holds its first attempt, for the failover test and benchmark.

Test-only, in the manner of :mod:`tests.e2e.killable_worker`: ``python tests/recovery/failover_worker.py
--state-dir STATE worker --queues forge,model`` installs the probe into :func:`pipeline.worker.runner.activities_for`
and runs the CLI. The supervisor starts its children with this same command line, so they serve the probe too.

``probe.hold`` (a synchronous activity, run in the worker's thread pool as the real ones are) beats with
:class:`pipeline.activities.heartbeat.Heartbeat` every 2 s while it sleeps: ``first_s`` on its first attempt
(the one a test kills), ``later_s`` on any later one. It answers which process ran the attempt and which
attempt it was.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from temporalio import activity

from pipeline.activities.heartbeat import Heartbeat
from pipeline.services import Services
from pipeline.steps import TaskQueue
from pipeline.worker import runner as worker
from tests.recovery.failover import PROBE, Held, Hold


@activity.defn(name=PROBE)
def hold(inp: Hold) -> Held:
    info = activity.info()
    seconds = inp.first_s if info.attempt == 1 else inp.later_s
    with Heartbeat(f"holding {seconds:.0f} s"):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
    return Held(pid=os.getpid(), attempt=info.attempt)


def install() -> None:
    real = worker.activities_for

    def with_probe(queue: TaskQueue, services: Services, host: str = "") -> Sequence[Callable[..., object]]:
        found = real(queue, services, host)
        return [*found, hold] if queue == TaskQueue.MODEL else found

    worker.activities_for = with_probe


if __name__ == "__main__":
    install()
    from pipeline.cli import main

    main()
