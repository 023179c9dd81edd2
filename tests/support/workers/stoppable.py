"""A ``durafix worker`` that SIGSTOPs itself in the middle of a step, once across processes (test-only).

``DURAFIX_TEST_STOP_AT`` names where: ``activity:<ForgeActivities method>`` stops as the attempt begins (before
the activity body runs, i.e. before any check it makes), ``adapter:<GitHubForge method>`` stops inside the
activity just before the forge write (after the activity's checks). The first call to stop at writes
``stopped.json`` (the attempt's activity ID, attempt number and task token, base64) to
``DURAFIX_TEST_STOP_DIR`` and stops the whole process: its pollers, heartbeats and the attempt. After a SIGCONT
the call goes on as it would have (shielded from the worker's own cancellation of the timed-out attempt, see
the wrapper), and ``resumed.json`` says how it ended: its result or the error it raised, and whether the
worker cancelled the attempt meanwhile.
Once ``stopped.json`` exists, later processes never stop, so a successor running this script runs normally.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio import activity

from pipeline.activities.forge import ForgeActivities
from reviews.adapter import GitHubForge


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


def install() -> None:
    marker_dir = Path(os.environ["DURAFIX_TEST_STOP_DIR"])
    marker_dir.mkdir(parents=True, exist_ok=True)
    where, name = os.environ["DURAFIX_TEST_STOP_AT"].split(":", 1)
    owner: type = {"activity": ForgeActivities, "adapter": GitHubForge}[where]
    # functools.wraps keeps the activity definition, so the worker registers the wrapper under the same name.
    setattr(owner, name, _stopping(getattr(owner, name), marker_dir))


if __name__ == "__main__":
    install()
    from pipeline.cli import main

    main()
