"""``durafix worker``'s supervisor: the pollers run in a child process, and a dead child costs seconds, not minutes.

The supervisor is a small process that runs no activity itself. It starts the worker as a child (the same
command line run again with :data:`CHILD_ENV` set, so whatever the command's script set up runs in the child
too) and keeps a second child warm: imported, connected and its workers built, waiting on its stdin for
``go`` before it polls. Whether this host can serve the queues asked for is checked once, by ``durafix worker``
in the supervisor's process before any child starts (:mod:`pipeline.worker.capabilities`): a host that cannot is
refused there, not by children dying in a loop. When the polling child dies (``waitpid`` reports it, SIGKILL included):

1. the warm spare is told ``go`` at once, so a poller exists again within milliseconds (a cold start of the
   worker takes seconds, more on a loaded host);
2. every activity attempt the dead child recorded in its in-flight directory (:mod:`pipeline.worker.inflight`) is
   failed through its task token with a retryable ``WorkerLost`` error and an almost-zero retry delay: the
   server starts the next attempt at once, on the promoted child, instead of waiting for the heartbeat or
   start-to-close timeout. The runs those attempts belong to get their sticky queue reset, so the workflow
   task that follows goes to the normal queue and not to the dead child's sticky queue (the orchestration
   worker also keeps a short ``sticky_queue_schedule_to_start_timeout`` for the runs it had cached);
3. a new spare is started. A child that dies within :data:`QUICK_S` of its start is a quick death;
   consecutive quick deaths back off (1 s, 2 s, 4 s, ... up to 30 s) and after :data:`MAX_QUICK_DEATHS` with
   no child polling the supervisor stops, saying why (exit 1). Spares that die while a child polls never stop
   it: a host cut off from Temporal starts no spare (the new one cannot connect), yet its polling child
   reconnects by itself once the link is back, so stopping would turn a network outage into a dead host.
   Such spares are started again every 30 s at most until one comes up.

``durafix worker --no-spare`` keeps no spare: a host short of CPU or memory (a CI runner, a laptop, a test
stack that starts a worker per test) saves a whole worker's start and its memory, and a dead child is then
replaced by a cold start (seconds, more on a loaded host; its attempts are still failed at once, so their
retries wait for that start, not for a timeout).

Every :data:`SWEEP_EVERY_S`, and once at start, the supervisor also fails the attempts left by any dead
worker process on the same state directory (a supervisor killed together with its child, an unsupervised
worker): :func:`pipeline.worker.inflight.sweep`.

An attempt failed here can never record a result: the server refuses its task token from then on, so a
child that were somehow still alive could not complete it (its result is dropped with ``NOT_FOUND``).

With ``DURAFIX_METRICS_PORT`` the supervisor serves ``/metrics`` there: its own gauge and counter and the polling
child's registry, which each child serves on a loopback port it says on stdout before ``ready``
(:mod:`pipeline.observability.endpoint`); the port outlives the children.

SIGTERM/SIGINT stop the children gracefully (each stops polling and gives running activities the grace
period, as an unsupervised worker does); the supervisor exits when they have. The children are in the
supervisor's process group, so signalling the group (``kill -- -PID``) reaches them too; a child whose
supervisor dies (its stdin closes) stops the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client

from environments.processes import start_time
from pipeline.config import DurafixConfig
from pipeline.observability.endpoint import METRICS_LINE
from pipeline.observability.supervisor_metrics import SupervisorMetrics
from pipeline.temporal_connection import connect
from pipeline.worker.dead_polls import fail_retries_started_by_the_dead
from pipeline.worker.inflight import Attempt, InflightDir, fail_dir, note, sweep
from pipeline.worker.tmp_root import remove_of
from pipeline.worker.tmp_root import sweep as sweep_tmp

CHILD_ENV = "DURAFIX_WORKER_SUPERVISOR"
"""Set (to the supervisor's pid) in a child's environment: the process is a supervised worker child."""

READY = "ready"
GO = "go"
QUICK_S = 10.0
MAX_QUICK_DEATHS = 5
MAX_BACKOFF_S = 30.0
SWEEP_EVERY_S = 30.0
STOP_GRACE_S = 30.0


def child_argv() -> list[str]:
    """This process's own command line (interpreter, its options, script or ``-m`` module, arguments)."""
    return [sys.executable, *sys.orig_argv[1:]]


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


@dataclass
class Child:
    """A worker child: its process, when it started, whether it is ready and whether it polls."""

    proc: asyncio.subprocess.Process
    started: float
    inflight: InflightDir
    start_ticks: int
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    polling: bool = False
    promote_when_ready: bool = False
    metrics_port: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Deaths:
    """Consecutive quick deaths and the back-off they earn."""

    quick: int = 0
    last: str = ""

    def died(self, child: Child, code: int | None) -> None:
        self.last = describe_exit(code)
        self.quick = self.quick + 1 if time.monotonic() - child.started < QUICK_S else 0

    def backoff_s(self) -> float:
        return 0.0 if self.quick <= 1 else min(2.0 ** (self.quick - 2), MAX_BACKOFF_S)

    def given_up(self) -> bool:
        """Enough quick deaths in a row to call it a crash loop (the supervisor stops only if no child polls)."""
        return self.quick >= MAX_QUICK_DEATHS


class Supervisor:
    """Runs one polling child and one warm spare until stopped (see the module)."""

    def __init__(
        self,
        config: DurafixConfig,
        argv: Sequence[str] | None = None,
        *,
        spare: bool = True,
        tmp_base: Path | None = None,
    ) -> None:
        """``tmp_base``: where the children make their temporary roots (:mod:`pipeline.worker.tmp_root`), which
        the supervisor removes as each child dies; None: the children's are left to their own removal."""
        self.config = config
        self.tmp_base = tmp_base
        self.argv = list(argv or child_argv())
        self.spare_wanted = spare
        self.active: Child | None = None
        self.spare: Child | None = None
        self.deaths = Deaths()
        self.stopping = asyncio.Event()
        self.exits: asyncio.Queue[tuple[Child, int]] = asyncio.Queue()
        self._client: asyncio.Task[Client] | None = None
        self.gave_up = False
        self._tasks: set[asyncio.Task[object]] = set()
        self.metrics = SupervisorMetrics(lambda: self._polling_child() is not None, self._child_metrics_port)

    def _polling_child(self) -> Child | None:
        active = self.active
        return active if active is not None and active.polling and active.proc.returncode is None else None

    def _child_metrics_port(self) -> int | None:
        child = self._polling_child()
        return child.metrics_port if child is not None else None

    # --- children -------------------------------------------------------------------------------------------

    async def _spawn(self) -> Child:
        env = {**os.environ, CHILD_ENV: str(os.getpid())}
        proc = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env
        )
        # Read now, while the child cannot have been reaped: its temporary root is named with it.
        ticks = start_time(proc.pid)
        child = Child(
            proc=proc,
            started=time.monotonic(),
            inflight=InflightDir.for_process(self.config.state_dir, proc.pid),
            start_ticks=ticks,
        )
        self._spawned(self._watch(child))
        return child

    async def _watch(self, child: Child) -> None:
        """Read the child's ``ready`` line, then wait for its exit and queue it."""
        assert child.proc.stdout is not None
        while True:
            line = await child.proc.stdout.readline()
            if not line:
                break
            text = line.decode(errors="replace").strip()
            if text.startswith(f"{METRICS_LINE} ") and text.split()[-1].isdigit():
                child.metrics_port = int(text.split()[-1])
            if text == READY:
                child.ready.set()
                if child.promote_when_ready:
                    self._go(child)
                else:
                    note(f"worker process {child.pid} ready (spare)")
                break
        code = await child.proc.wait()
        await self.exits.put((child, code))

    def _go(self, child: Child) -> None:
        """Tell a ready child to start polling (it does not before it is told)."""
        if child.polling or child.proc.stdin is None:
            return
        child.polling = True
        child.promote_when_ready = False
        with contextlib.suppress(ConnectionError, RuntimeError):
            child.proc.stdin.write(f"{GO}\n".encode())
        note(f"worker process {child.pid} polls")

    async def _start_active(self) -> None:
        """The spare becomes the polling child if there is one (at once if ready), else a new child does."""
        child = self.spare
        self.spare = None
        if child is None:
            child = await self._spawn()
        self.active = child
        if child.ready.is_set():
            self._go(child)
        else:
            child.promote_when_ready = True

    async def _start_spare(self, delay_s: float = 0.0) -> None:
        if not self.spare_wanted or self.spare is not None:
            return
        # A spare starts once the polling child is up: two cold starts at once only slow the first.
        while self.active is not None and not self.active.ready.is_set() and not self.stopping.is_set():
            await asyncio.sleep(0.2)
        if delay_s:
            await asyncio.sleep(delay_s)
        if self.stopping.is_set() or self.spare is not None:
            return
        self.spare = await self._spawn()

    # --- deaths ---------------------------------------------------------------------------------------------

    async def client(self) -> Client:
        if self._client is None:
            self._client = asyncio.create_task(self._connect())
        return await self._client

    async def _connect(self) -> Client:
        delay = 0.5
        while True:
            try:
                return await connect(self.config)
            except Exception as err:  # the server may not be up yet; the children say so themselves
                note(f"supervisor cannot reach Temporal yet ({err}); retrying")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _remove_tmp(self, child: Child) -> None:
        """Remove the dead child's temporary root: a child that was killed could not (a thread: a browser's
        home may hold a whole profile)."""
        if self.tmp_base is None:
            return
        try:
            removed = await asyncio.to_thread(remove_of, self.tmp_base, child.pid, child.start_ticks)
        except OSError as err:  # the next worker's start sweeps it
            note(f"removing worker process {child.pid}'s temporary files failed: {err!r}")
            return
        for path in removed:
            note(f"removed {path}, worker process {child.pid}'s temporary files")

    async def _fail_left(self, child: Child, code: int | None) -> None:
        """Fail the attempts the dead child left (see :mod:`pipeline.worker.inflight`)."""
        if not child.inflight.path.exists():
            return
        client = await self.client()
        why = f"worker process {child.pid} died ({describe_exit(code)})"
        failed = await fail_dir(client, child.inflight, why)
        for attempt in failed:
            note(f"failed {attempt.activity_type} attempt {attempt.attempt} of {attempt.workflow_id}: {why}")
        if failed and not self.stopping.is_set():
            self._spawned(self._watch_retries(client, failed, child.pid, why))

    async def _watch_retries(self, client: Client, failed: list[Attempt], pid: int, why: str) -> None:
        """Fail again the retries the server handed to the dead child's polls (:mod:`pipeline.worker.dead_polls`)."""
        try:
            again = await fail_retries_started_by_the_dead(client, failed, pid, why)
        except Exception as err:  # the heartbeat timeouts remain the backstop
            note(f"watching the retries of worker process {pid}'s attempts failed: {err!r}")
            return
        for workflow_id, step, attempt in again:
            note(f"failed {step} attempt {attempt} of {workflow_id} again: the server handed it to a poll of {pid}")

    async def _sweeps(self) -> None:
        client = await self.client()
        while not self.stopping.is_set():
            try:
                await sweep(client, self.config.state_dir)
            except Exception as err:  # a sweep that fails is tried again; the heartbeat timeout is the backstop
                note(f"in-flight sweep failed: {err!r}")
            if self.tmp_base is not None:
                # Other dead workers' temporary roots (one killed with its own supervisor, an unsupervised one).
                with contextlib.suppress(OSError):
                    await asyncio.to_thread(sweep_tmp, self.tmp_base)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), SWEEP_EVERY_S)

    async def _on_exit(self, child: Child, code: int) -> None:
        self._spawned(self._remove_tmp(child))
        was_active = child is self.active
        if was_active:
            self.active = None
        elif child is self.spare:
            self.spare = None
        if self.stopping.is_set():
            await self._fail_left(child, code)
            return
        self.deaths.died(child, code)
        self.metrics.deaths.inc()
        role = "polling" if was_active else "spare"
        note(f"{role} worker process {child.pid} died ({describe_exit(code)})")
        serving = self._polling_child() is not None
        if self.deaths.given_up() and not serving:
            note(
                f"worker processes died {self.deaths.quick} times in a row within {QUICK_S:.0f} s of starting "
                f"(last: {self.deaths.last}); giving up: see the log above for why"
            )
            self.stopping.set()
            self.gave_up = True
            await self._fail_left(child, code)
            return
        backoff = self.deaths.backoff_s()
        if was_active:
            if backoff and self.spare is None:
                await asyncio.sleep(backoff)
            await self._start_active()  # first: the retries about to be scheduled need a poller
        await self._fail_left(child, code)
        self._spawned(self._start_spare(backoff))

    def _spawned(self, coro: Coroutine[Any, Any, object]) -> None:
        task: asyncio.Task[object] = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- the loop -------------------------------------------------------------------------------------------

    async def run(self) -> int:
        """Supervise until SIGTERM/SIGINT (exit 0) or a crash loop (exit 1)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        note(f"supervisor {os.getpid()} starting the worker process")
        if self.config.metrics_port is not None:
            self.metrics.serve(self.config.metrics_port)
        await self._start_active()
        self._spawned(self._sweeps())
        self._spawned(self._start_spare())
        stop = asyncio.create_task(self.stopping.wait())
        while not self.stopping.is_set():
            exited = asyncio.create_task(self.exits.get())
            done, _ = await asyncio.wait([exited, stop], return_when=asyncio.FIRST_COMPLETED)
            if exited in done:
                await self._on_exit(*exited.result())
            else:
                exited.cancel()
        await self._stop_children()
        self.metrics.close()
        for task in list(self._tasks):
            task.cancel()
        note("supervisor stopped")
        return 1 if self.gave_up else 0

    async def _stop_children(self) -> None:
        children = [c for c in (self.active, self.spare) if c is not None and c.proc.returncode is None]
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for child in children:
            try:
                await asyncio.wait_for(child.proc.wait(), max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                note(f"worker process {child.pid} did not stop in {STOP_GRACE_S:.0f} s; killing it")
                with contextlib.suppress(ProcessLookupError):
                    child.proc.kill()
                await child.proc.wait()
        # Whatever a stopped child could not finish is handed back now, not after its timeouts.
        for child in children:
            await self._fail_left(child, child.proc.returncode)
            # A child that stopped cleanly removed its own; one killed after the grace period could not.
            await self._remove_tmp(child)


async def supervise(config: DurafixConfig, *, spare: bool = True, tmp_base: Path | None = None) -> int:
    return await Supervisor(config, spare=spare, tmp_base=tmp_base).run()


def is_child() -> bool:
    return CHILD_ENV in os.environ


def supervisor_pid() -> int | None:
    value = os.environ.get(CHILD_ENV, "")
    return int(value) if value.isdigit() else None
