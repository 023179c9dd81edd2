"""A real ``durafix worker`` with one test fault installed, then the product's CLI: every launcher of a faulty
worker in one place.

``python tests/support/workers/faulty.py FAULT --state-dir STATE worker [...]`` installs ``FAULT`` and runs
``durafix`` with the rest of the command line. A supervised worker starts its children with this same
command line, so they carry the fault too. The faults (all test-only, none in the product):

``kill-after-forge-write``
    the named ``GitHubForge`` methods (``DURAFIX_TEST_KILL_AFTER``, comma-separated) SIGKILL the process the
    first time each returns: the forge applied the mutation, the activity has not completed. One marker file
    per operation in ``DURAFIX_TEST_KILL_DIR`` makes each kill happen once across successive processes.
``kill-after-docker-create``
    ``DockerProvider._create`` SIGKILLs the process the first time it returns for an operation, before the
    provider starts the container, probes it or reports anything: the engine holds a created container nobody
    recorded, and ``env.provision`` never completed (one marker per op in ``DURAFIX_TEST_KILL_DIR``).
``failover-probe``
    the model queue also serves ``probe.hold`` (:mod:`tests.support.failover`): a heartbeating synchronous
    activity that holds ``first_s`` on its first attempt (the one a test kills) and ``later_s`` on any later
    one, answering which process ran which attempt.
``stop-mid-step``
    ``DURAFIX_TEST_STOP_AT`` names where the process SIGSTOPs itself, once across processes:
    ``activity:<ForgeActivities method>`` as the attempt begins (before any check the activity makes),
    ``adapter:<GitHubForge method>`` inside the activity just before the forge write. The first stop writes
    ``stopped.json`` (activity ID, attempt, task token in base64, pid) to ``DURAFIX_TEST_STOP_DIR``; after a
    SIGCONT the call goes on as it would have, and ``resumed.json`` says how it ended (its result or error, and
    whether the worker cancelled the attempt meanwhile).
``hold-after-work``
    an environment or browser activity whose operation is one of ``DURAFIX_TEST_HOLD`` (comma-separated steps
    of operation IDs ``<workflow ID>:<step>[:<n>]``, e.g. ``baseline,reproduce-base``) does its whole work,
    then, instead of returning, notes ``<step>.json`` (activity type, attempt, pid) in ``DURAFIX_TEST_KILL_DIR``
    and holds, heartbeating, until its process is killed: the work is done, its result never reaches the
    server. Once per step across processes (the note is the marker).
``hold-until-cancelled``
    an environment or browser activity whose operation's step is one of ``DURAFIX_TEST_HOLD`` (comma-separated,
    e.g. ``reproduce-candidate-1``), in any run, does none of its work: it notes ``<step>.json`` (activity type,
    attempt, pid) in ``DURAFIX_TEST_KILL_DIR``/``<the run's path key>`` and holds, heartbeating (a heartbeat is
    how a cancellation reaches it), until the workflow cancels it; then it notes ``<step>.cancelled.json`` and
    ends cancelled. Nothing else ends it but the attempt's timeouts. The cancellation reaches it with the answer
    to the worker's next heartbeat, which the worker's heartbeat throttle (5 s) may delay that long. An activity
    whose step is one of ``DURAFIX_TEST_AFTER_HOLD`` (e.g. ``verify``) starts its work only once every held step
    of its run is holding (at most :data:`AFTER_HOLD_WAIT_S`, then it goes on and the test's assertions say what
    happened): a check that runs beside a held one fails, if it fails, only after the held one started.
``changed-workflow``
    :class:`tests.replay.changed_workflow.ChangedRepairBug` is registered in place of the current
    ``repair_bug`` (same name, same queues, every activity as in the product).
"""

from __future__ import annotations

import base64
import functools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import CancelledError

from environments.docker.provider import DockerProvider
from environments.files import path_key
from environments.interface import AppRecipe
from pipeline.activities.browser import BrowserActivities
from pipeline.activities.environments import EnvironmentActivities
from pipeline.activities.forge import ForgeActivities
from pipeline.activities.heartbeat import Heartbeat
from pipeline.ids import op_step
from pipeline.services import Services
from pipeline.steps import TaskQueue
from pipeline.worker import runner as worker
from pipeline.worker.logs import worker_logger
from reviews.adapter import GitHubForge
from tests.support.failover import PROBE, Held, Hold


def _dying_after(name: str, original: Callable[..., Any], marker_dir: Path) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: GitHubForge, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        marker = marker_dir / name
        if not marker.exists():
            marker.write_text(repr(result))
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    return wrapper


def kill_after_forge_write() -> None:
    marker_dir = Path(os.environ["DURAFIX_TEST_KILL_DIR"])
    marker_dir.mkdir(parents=True, exist_ok=True)
    for name in os.environ["DURAFIX_TEST_KILL_AFTER"].split(","):
        setattr(GitHubForge, name, _dying_after(name, getattr(GitHubForge, name), marker_dir))


def kill_after_docker_create() -> None:
    marker_dir = Path(os.environ["DURAFIX_TEST_KILL_DIR"])
    marker_dir.mkdir(parents=True, exist_ok=True)
    create = DockerProvider._create

    @functools.wraps(create)
    def create_then_die(
        self: DockerProvider, name: str, image: str, network: str, run_id: str, op_id: str, recipe: AppRecipe
    ) -> Any:
        container = create(self, name, image, network, run_id, op_id, recipe)
        marker = marker_dir / path_key(op_id)
        if not marker.exists():
            marker.write_text(op_id)
            os.kill(os.getpid(), signal.SIGKILL)
        return container

    DockerProvider._create = create_then_die  # type: ignore[method-assign]


@activity.defn(name=PROBE)
def hold(inp: Hold) -> Held:
    info = activity.info()
    seconds = inp.first_s if info.attempt == 1 else inp.later_s
    with Heartbeat(f"holding {seconds:.0f} s"):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
    return Held(pid=os.getpid(), attempt=info.attempt)


def failover_probe() -> None:
    real = worker.activities_for

    def with_probe(queue: TaskQueue, services: Services, host: str = "") -> Sequence[Callable[..., object]]:
        found = real(queue, services, host)
        return [*found, hold] if queue == TaskQueue.MODEL else found

    worker.activities_for = with_probe


def _stopping(original: Callable[..., Any], marker_dir: Path) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: object, *args: Any, **kwargs: Any) -> Any:
        stopped = marker_dir / "stopped.json"
        if stopped.exists():
            return original(self, *args, **kwargs)
        info = activity.info()
        stopped.write_text(
            json.dumps(
                {
                    "activity_id": info.activity_id,
                    "activity_type": info.activity_type,
                    "attempt": info.attempt,
                    "task_token": base64.b64encode(info.task_token).decode(),
                    "pid": os.getpid(),
                }
            )
        )
        # Shielded from the SDK's in-thread cancellation: waking, the worker finds its attempt timed out and
        # cancels it, but a write already on the wire (a thread blocked in a socket call) is not stopped by
        # that. The shield makes the late call always run, so that what meets it is the forge's guards and the
        # run's fence alone; the cancellation is raised when the block ends.
        with activity.shield_thread_cancel_exception():
            # Directed at this thread, not the process: a process-directed SIGSTOP may be taken by another
            # thread, and this one would run on (past the activity's checks, into its write) until that
            # thread's group stop reached it. Sent to itself, the calling thread stops as the call returns.
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
            woke_at = time.time()

            def note(outcome: dict[str, Any]) -> None:
                outcome["cancelled_meanwhile"] = activity.is_cancelled()
                outcome["woke_at"] = woke_at
                (marker_dir / "resumed.json").write_text(json.dumps(outcome))

            try:
                result = original(self, *args, **kwargs)
            except Exception as err:
                note({"error": type(err).__name__, "detail": str(err)})
                raise
            note({"result": repr(result)})
            return result

    return wrapper


def stop_mid_step() -> None:
    marker_dir = Path(os.environ["DURAFIX_TEST_STOP_DIR"])
    marker_dir.mkdir(parents=True, exist_ok=True)
    where, name = os.environ["DURAFIX_TEST_STOP_AT"].split(":", 1)
    owner: type = {"activity": ForgeActivities, "adapter": GitHubForge}[where]
    # functools.wraps keeps the activity definition, so the worker registers the wrapper under the same name.
    setattr(owner, name, _stopping(getattr(owner, name), marker_dir))


def _held_after(original: Callable[..., Any], steps: frozenset[str], marker_dir: Path) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: object, inp: object, *args: Any, **kwargs: Any) -> Any:
        result = original(self, inp, *args, **kwargs)
        run_id, op = getattr(inp, "run_id", None), getattr(inp, "op_id", None)
        if not (isinstance(run_id, str) and isinstance(op, str)):
            return result
        step = op_step(op, run_id)
        if step not in steps or (marker := marker_dir / f"{step}.json").exists():
            return result
        info = activity.info()
        note = {"activity_type": info.activity_type, "attempt": info.attempt, "op_id": op, "pid": os.getpid()}
        # Renamed into place: whoever waits for the note never reads it half-written.
        marker.with_suffix(".tmp").write_text(json.dumps(note))
        marker.with_suffix(".tmp").replace(marker)
        # Beating, so that nothing but the kill ends the attempt: not its heartbeat timeout, not a cancellation.
        with activity.shield_thread_cancel_exception(), Heartbeat(f"held by the test after {step}"):
            while True:
                time.sleep(0.2)

    return wrapper


def hold_after_work() -> None:
    marker_dir = Path(os.environ["DURAFIX_TEST_KILL_DIR"])
    marker_dir.mkdir(parents=True, exist_ok=True)
    steps = frozenset(os.environ["DURAFIX_TEST_HOLD"].split(","))
    # On the classes, not on what activities_for returns: a host's own queue registers the browser's reproduce
    # and the environments' steps from these classes too (pipeline/hosts.py).
    for owner in (EnvironmentActivities, BrowserActivities):
        for name, fn in list(vars(owner).items()):
            if hasattr(fn, "__temporal_activity_definition"):
                # functools.wraps keeps the activity definition, so the worker registers the wrapper under its name.
                setattr(owner, name, _held_after(fn, steps, marker_dir))


AFTER_HOLD_WAIT_S = 120.0
"""How long an activity of ``DURAFIX_TEST_AFTER_HOLD`` waits for its run's held steps to be holding."""


def _note(path: Path, note: dict[str, Any]) -> None:
    """``note`` as JSON at ``path``, renamed into place: whoever waits for it never reads it half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".tmp").write_text(json.dumps(note))
    path.with_suffix(".tmp").replace(path)


def _held_before(
    original: Callable[..., Any], held: frozenset[str], after: frozenset[str], notes: Path
) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: object, inp: object, *args: Any, **kwargs: Any) -> Any:
        run_id, op = getattr(inp, "run_id", None), getattr(inp, "op_id", None)
        if not (isinstance(run_id, str) and isinstance(op, str)):
            return original(self, inp, *args, **kwargs)
        step = op_step(op, run_id)
        run_notes = notes / path_key(run_id)
        if step in after:
            _wait_for_holds(run_notes, held, step)
        if step not in held:
            return original(self, inp, *args, **kwargs)
        info = activity.info()
        about = {"activity_type": info.activity_type, "attempt": info.attempt, "op_id": op, "pid": os.getpid()}
        _note(run_notes / f"{step}.json", about)
        # In the worker's log too, with the run and step its lines carry: the test reads the hold from there.
        worker_logger().info("held by the test before its work until cancelled: %s", op)
        # Shielded: the cancellation is awaited and noted here rather than raised into the thread mid-wait; the
        # helper thread's beats are what carry it from the server to this worker.
        with activity.shield_thread_cancel_exception(), Heartbeat(f"held by the test before {step}", every_s=0.5):
            activity.wait_for_cancelled_sync()
            _note(run_notes / f"{step}.cancelled.json", about)
            worker_logger().info("the cancellation reached the held step: %s", op)
        raise CancelledError("cancelled while held by the test")

    return wrapper


def _wait_for_holds(run_notes: Path, held: frozenset[str], step: str) -> None:
    """Wait (beating) until every step of ``held`` is holding in the run, at most :data:`AFTER_HOLD_WAIT_S`."""
    deadline = time.monotonic() + AFTER_HOLD_WAIT_S
    with Heartbeat(f"{step} waits for the test's held steps"):
        while not all((run_notes / f"{h}.json").exists() for h in held):
            if time.monotonic() > deadline:
                worker_logger().warning("%s went on after %.0f s: no hold of %s began", step, AFTER_HOLD_WAIT_S, held)
                return
            time.sleep(0.1)


def hold_until_cancelled() -> None:
    notes = Path(os.environ["DURAFIX_TEST_KILL_DIR"])
    notes.mkdir(parents=True, exist_ok=True)
    held = frozenset(os.environ["DURAFIX_TEST_HOLD"].split(","))
    after = frozenset(filter(None, os.environ.get("DURAFIX_TEST_AFTER_HOLD", "").split(",")))
    # On the classes, as hold-after-work does: a host's own queue registers these activities from them too.
    for owner in (EnvironmentActivities, BrowserActivities):
        for name, fn in list(vars(owner).items()):
            if hasattr(fn, "__temporal_activity_definition"):
                setattr(owner, name, _held_before(fn, held, after, notes))


def changed_workflow() -> None:
    from pipeline.flow.attempt import RepairAttemptWorkflow
    from tests.replay.changed_workflow import ChangedRepairBug

    # The worker hosts every workflow of pipeline.workflow.WORKFLOWS: the changed run in place of the current one.
    worker.WORKFLOWS = (ChangedRepairBug, RepairAttemptWorkflow)  # type: ignore[attr-defined]


FAULTS: dict[str, Callable[[], None]] = {
    "kill-after-forge-write": kill_after_forge_write,
    "kill-after-docker-create": kill_after_docker_create,
    "failover-probe": failover_probe,
    "stop-mid-step": stop_mid_step,
    "hold-after-work": hold_after_work,
    "hold-until-cancelled": hold_until_cancelled,
    "changed-workflow": changed_workflow,
}


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in FAULTS:
        raise SystemExit(f"usage: faulty.py {{{','.join(FAULTS)}}} DURAFIX_ARGS...")
    FAULTS[argv[0]]()
    from pipeline.cli import main as durafix

    durafix(argv[1:])


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # run by path: the checkout's packages
    main(sys.argv[1:])
