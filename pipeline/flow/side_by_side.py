"""Independent checks of one revision run side by side (CHECKS_SIDE_BY_SIDE_PATCH): the base reproduction beside
the baseline tests, a candidate's reproduction replayed beside its tests.

A check is a coroutine that returns ``None`` when it passed, the reason when it failed, or raises (a
:class:`~pipeline.flow.context.RunEnded` is a failure too). Each runs as a task of the workflow; the first to
fail cancels every other still running: the activity it awaits is cancelled, and the check's own code decides
what a cancellation leaves (a reproduction tears its environment down). A check cancelled that way has no result
and its cancellation is not a failure. :attr:`RunState.checks_beside` names the checks while they run, so
``durafix status`` says both are running (the phase is the first check's).

Deterministic: the workflow's event loop runs the tasks in the order their events arrive, the same on replay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pipeline.flow.context import RunContext

Check = Coroutine[Any, Any, str | None]


async def side_by_side(ctx: RunContext, checks: Mapping[str, Check]) -> str | None:
    """Run ``checks`` (by name) at once and wait until every one ended. Returns None when all passed, else the
    first failure's reason; raises the first failure when it was an exception."""
    first: list[str | BaseException] = []
    tasks: list[asyncio.Task[str | None]] = []

    def failed(index: int, failure: str | BaseException) -> None:
        if first:
            return  # a sibling failed first: what this one did after is its own record's, not the verdict
        first.append(failure)
        for other, task in enumerate(tasks):
            if other != index and not task.done():
                task.cancel()

    async def guarded(index: int, check: Check) -> str | None:
        try:
            failure = await check
        except BaseException as err:
            failed(index, err)
            raise
        if failure is not None:
            failed(index, failure)
        return failure

    ctx.state.checks_beside = list(checks)
    tasks.extend(asyncio.create_task(guarded(n, check)) for n, check in enumerate(checks.values()))
    try:
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        ctx.state.checks_beside = []
    if not first:
        return None
    if isinstance(first[0], BaseException):
        raise first[0]
    return first[0]
