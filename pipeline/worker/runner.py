"""``durafix worker``: polls one or more task queues (one per capability) until told to stop.

Each queue can run on its own hosts: ``--queues forge,model`` on a small host, ``--queues browser`` where
Chromium is installed, ``--queues environments`` where the apps run. The workflow itself only needs the
orchestration queue. On SIGTERM/SIGINT the worker stops polling and gives running activities a grace period
(activities heartbeat, so cancellation reaches them).

``durafix worker`` runs the pollers below in a child of :mod:`pipeline.worker.supervisor` (``--no-supervise``: in
the command's own process). Every activity attempt is recorded in the process's in-flight directory while it
runs (:mod:`pipeline.worker.inflight`), so that when the process dies its attempts are failed and retried at once;
a worker process that starts also fails whatever dead worker processes left on its state directory.

Each queue's worker takes its limits from ``queue_settings`` (:mod:`pipeline.worker.queue_settings`): tasks at
once, activities started per second, the orchestration worker's sticky cache. Before any of this, the
command checks that this host can serve the queues asked for (:mod:`pipeline.worker.capabilities`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Interceptor, Worker

from pipeline.activities.heartbeat import heartbeating
from pipeline.config import DurafixConfig
from pipeline.hosts import host_id, host_queue, serves_host_queue
from pipeline.observability.worker_telemetry import WorkerTelemetry
from pipeline.services import Services
from pipeline.steps import TaskQueue
from pipeline.temporal_connection import connect, connect_options
from pipeline.worker.inflight import InflightDir, InflightInterceptor, note, sweep
from pipeline.worker.logs import StepLogInterceptor, worker_logger
from pipeline.worker.queue_settings import NO_OVERRIDES, Overrides, worker_limits
from pipeline.worker.supervisor import GO, READY, supervisor_pid
from pipeline.workflow import WORKFLOWS

# A run's next workflow task waits this long on the sticky queue of the process that last ran it before the
# server hands it to the normal queue: when that process died, the run resumes after this, not the SDK's 10 s.
STICKY_SCHEDULE_TO_START = timedelta(seconds=2)
# Heartbeats reach the server at least this often (the SDK's throttle is 80% of the timeout, up to 60 s): a
# late beat on a loaded host never comes near a heartbeat timeout of RunPolicy (60 s and more by default). The
# server's answer to a beat is also how a cancellation reaches a running activity, and a check cancelled by a
# failing sibling holds its run until it acknowledges: at 5 s a failed candidate's reproduction took about 3 s
# to learn of it; a beat a second (from the 1 s of Heartbeat) is one small RPC per running activity.
HEARTBEAT_THROTTLE = timedelta(seconds=1)


def activities_for(queue: TaskQueue, services: Services, host: str = "") -> Sequence[Callable[..., object]]:
    """The activity implementations served on ``queue`` (built lazily: a host needs only its own). ``host``: the
    host queue the worker also polls (its environments are stamped with it)."""
    if queue == TaskQueue.FORGE:
        # Forge calls beat too, so their attempts have a heartbeat timeout shorter than start-to-close.
        return [heartbeating(a) for a in services.forge_activities().all()]
    if queue == TaskQueue.ENVIRONMENTS:
        from pipeline.activities.reproduction_seed import ReproductionSeedActivities
        from pipeline.activities.run_record import RunRecordActivities

        return [
            *services.environment_activities(host).all(),
            *services.agent_run_activities().all(),
            *RunRecordActivities(services.store).all(),
            *ReproductionSeedActivities(services.store, services.workspaces, services.git_token).all(),
        ]
    if queue == TaskQueue.BROWSER:
        return services.browser_activities().all()
    if queue == TaskQueue.MODEL:
        return services.model_activities().all()
    return []


def build_workers(
    client: Client,
    config: DurafixConfig,
    queues: Sequence[TaskQueue],
    executor: concurrent.futures.Executor,
    *,
    interceptors: Sequence[Interceptor] = (),
    identity: str | None = None,
    services: Services | None = None,
    overrides: Overrides = NO_OVERRIDES,
) -> list[Worker]:
    """One worker per queue, limited as :func:`pipeline.worker.queue_settings.worker_limits` says (``overrides``: the
    command's flags); ``interceptors`` wrap every activity (the in-flight records). ``services``: the
    collaborators to serve with (built from ``config`` when not given); whoever passes them closes them.
    Invalid queue settings: :class:`~pipeline.config.SettingsError`, before anything is built."""
    limits = {queue: worker_limits(config, queue, overrides) for queue in queues}
    services = services or Services(config)
    if TaskQueue.BROWSER in queues and config.browser_video:
        # A host that cannot record the video asked for fails now, not on its first reproduction.
        services.browser  # noqa: B018
    workers = []
    # A worker that holds environments its own browser reaches serves its host's queue too (pipeline/hosts.py).
    host = host_id(config.host_id) if serves_host_queue(queues) else ""
    if host:
        env = services.environment_activities(host)
        workers.append(
            Worker(
                client,
                task_queue=host_queue(host),
                activities=[
                    services.browser_activities().reproduce,
                    env.reproduce_in_environment,
                    env.teardown,
                    env.cleanup_run,
                ],
                activity_executor=executor,
                # Its reproductions are the browser queue's work moved here: the browser's limit holds for them.
                max_concurrent_activities=limits[TaskQueue.BROWSER].max_concurrent,
                graceful_shutdown_timeout=timedelta(seconds=10),
                max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
                interceptors=list(interceptors),
                identity=identity,
            )
        )
    for queue in queues:
        if queue == TaskQueue.ORCHESTRATION:
            workers.append(
                Worker(
                    client,
                    task_queue=queue.value,
                    workflows=list(WORKFLOWS),
                    identity=identity,
                    sticky_queue_schedule_to_start_timeout=STICKY_SCHEDULE_TO_START,
                    max_cached_workflows=limits[queue].sticky_cache or 0,
                    max_concurrent_workflow_tasks=limits[queue].max_concurrent,
                )
            )
            continue
        workers.append(
            Worker(
                client,
                task_queue=queue.value,
                activities=activities_for(queue, services, host),
                activity_executor=executor,
                max_concurrent_activities=limits[queue].max_concurrent,
                max_activities_per_second=limits[queue].rate_per_s,
                graceful_shutdown_timeout=timedelta(seconds=10),
                max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
                interceptors=list(interceptors),
                identity=identity,
            )
        )
    return workers


def worker_identity() -> str:
    """``PID@HOST`` as the SDK's default, where PID is the ``durafix worker`` command's own process: the
    supervisor's for a supervised child (followed by ``/child-PID``), the one an operator sees and signals."""
    host = socket.gethostname()
    parent = supervisor_pid()
    if parent is None:
        return f"{os.getpid()}@{host}"
    return f"{parent}@{host}/child-{os.getpid()}"


async def _sweep_dead(client: Client, config: DurafixConfig) -> None:
    try:
        await sweep(client, config.state_dir)
    except Exception as err:  # the heartbeat timeouts remain the backstop
        note(f"in-flight sweep failed: {err!r}")


async def _wait_for_go(stop: asyncio.Event) -> asyncio.StreamReader | None:
    """A supervised child: say ``ready`` on stdout, then wait for ``go`` on stdin. None: stop instead (told
    to, or the supervisor is gone: stdin closed). The reader is returned to watch for the supervisor's end."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(READY, flush=True)
    # The SDK core logs to fd 1; the supervisor reads it only up to "ready", so from here on fd 1 is the log.
    os.dup2(2, 1)
    line = asyncio.create_task(reader.readline())
    stopped = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([line, stopped], return_when=asyncio.FIRST_COMPLETED)
    if line not in done:
        line.cancel()
        return None
    stopped.cancel()
    return reader if line.result().decode(errors="replace").strip() == GO else None


async def _stop_when_closed(reader: asyncio.StreamReader, stop: asyncio.Event) -> None:
    while await reader.readline():
        pass
    note(f"worker process {os.getpid()}: the supervisor is gone; stopping")
    stop.set()


def activity_threads(config: DurafixConfig, queues: Sequence[TaskQueue], overrides: Overrides = NO_OVERRIDES) -> int:
    """Threads for the activity executor: enough for every activity queue's limit at once (16 at least), so a
    task the SDK hands over never waits for a thread."""
    wanted = sum(
        worker_limits(config, q, overrides).max_concurrent or 0 for q in queues if q != TaskQueue.ORCHESTRATION
    )
    return max(16, wanted)


async def run_worker(
    config: DurafixConfig, queues: Sequence[TaskQueue], *, standby: bool = False, overrides: Overrides = NO_OVERRIDES
) -> None:
    """Poll ``queues`` until SIGTERM/SIGINT. ``standby``: a supervised child, which builds everything, says
    ``ready`` and polls only once its supervisor says ``go`` (see :mod:`pipeline.worker.supervisor`). ``overrides``:
    the command's limits for every queue of this process."""
    threads = activity_threads(config, queues, overrides)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    telemetry = WorkerTelemetry.of(config, queues)
    client = await connect(config, runtime=telemetry.runtime if telemetry else None)
    inflight = InflightDir.for_process(config.state_dir)
    services = Services(config)
    try:
        with concurrent.futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="durafix-activity"
        ) as executor:
            await _serve(client, config, queues, executor, services, inflight, stop, telemetry, standby, overrides)
    finally:
        # After the executor's threads are done: nothing uses the browser any more. Closing it ends Chromium
        # and its driver and removes its home folder, which nothing else would (the process ends with os._exit).
        services.close()
    # Empty once every attempt returned; what is left is failed by whoever sweeps after this process is gone.
    with contextlib.suppress(OSError):
        inflight.path.rmdir()


async def _serve(
    client: Client,
    config: DurafixConfig,
    queues: Sequence[TaskQueue],
    executor: concurrent.futures.Executor,
    services: Services,
    inflight: InflightDir,
    stop: asyncio.Event,
    telemetry: WorkerTelemetry | None,
    standby: bool,
    overrides: Overrides,
) -> None:
    """Build the workers on ``services`` and poll until ``stop`` is set (or, a spare, until told to stop before
    it was told ``go``); returns once every worker has shut down."""
    workers = build_workers(
        client,
        config,
        queues,
        executor,
        interceptors=[
            InflightInterceptor(inflight),
            StepLogInterceptor(),
            *(telemetry.interceptors() if telemetry else []),
        ],
        identity=worker_identity(),
        services=services,
        overrides=overrides,
    )
    if telemetry:
        telemetry.serve(client, supervised=standby)
    if standby:
        reader = await _wait_for_go(stop)
        if reader is None:
            return
        background = asyncio.create_task(_stop_when_closed(reader, stop))
    else:
        # A supervisor sweeps for its children; an unsupervised worker sweeps once as it starts.
        background = asyncio.create_task(_sweep_dead(client, config))
    names = ", ".join(q.value for q in queues)
    where = connect_options(config).describe()
    note(f"durafix worker polling {names} on {where}")
    runs = [asyncio.create_task(w.run()) for w in workers]
    waiter = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([*runs, waiter], return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        if task is not waiter and task.exception() is not None:
            worker_logger().error("worker failed: %r", task.exception())
    note("durafix worker shutting down")
    await asyncio.gather(*(w.shutdown() for w in workers), return_exceptions=True)
    waiter.cancel()
    background.cancel()
    if telemetry:
        telemetry.close()
    # Empty once every attempt returned; what is left is failed by whoever sweeps after this process is gone.
    with contextlib.suppress(OSError):
        inflight.path.rmdir()
