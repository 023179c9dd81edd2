"""Per-queue worker settings: how many tasks a worker of each queue runs at once, how fast it starts
activities, and (orchestration) how many runs it keeps cached.

``DURAFIX_QUEUE_SETTINGS`` (``queue_settings`` in ``config.json``) is a JSON object from a queue's short name
to its :class:`QueueSettings`, every key optional::

    {"model": {"max_concurrent": 4, "rate_per_s": 2}, "orchestration": {"max_concurrent": 50, "sticky_cache": 200}}

The configuration keeps the value as given; :func:`worker_limits` validates it when a worker is built, so a
mistake stops ``durafix worker`` (a :class:`~pipeline.config.SettingsError`, exit 2) and no other command.
``durafix worker --max-concurrent`` / ``--rate-per-s`` override it for one process (:class:`Overrides`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.config import DurafixConfig, SettingsError
from pipeline.steps import TaskQueue

SETTING = "DURAFIX_QUEUE_SETTINGS"
DEFAULT_MAX_CONCURRENT_ACTIVITIES = 8
# The SDK's own limit of concurrent workflow tasks; it needs two or more while the sticky cache is on.
MIN_WORKFLOW_TASKS_WITH_CACHE = 2


def short_name(queue: TaskQueue) -> str:
    """``durafix-model`` -> ``model``: how settings and ``--queues`` name a queue."""
    return queue.value.removeprefix("durafix-")


BY_SHORT_NAME = {short_name(q): q for q in TaskQueue}
ALL_QUEUES = list(TaskQueue)


def parse_queues(text: str) -> list[TaskQueue]:
    """``--queues``: a comma list of short names, or ``all`` (or nothing) for every queue; ValueError names an
    unknown one."""
    if text in ("", "all"):
        return list(ALL_QUEUES)
    out: list[TaskQueue] = []
    for part in text.split(","):
        part = part.strip()
        if part not in BY_SHORT_NAME:
            raise ValueError(f"unknown queue {part!r}; choose from {', '.join(BY_SHORT_NAME)} or 'all'")
        out.append(BY_SHORT_NAME[part])
    return out


class QueueSettings(BaseModel):
    """One queue's worker settings; unset keys keep the defaults (:func:`worker_limits`)."""

    model_config = ConfigDict(extra="forbid")

    # Activity tasks one worker runs at once (orchestration: workflow tasks).
    max_concurrent: int | None = Field(default=None, gt=0)
    # Activities per second one worker starts (toward the model endpoint, the forge's rate limit).
    rate_per_s: float | None = Field(default=None, gt=0)
    # Runs the orchestration worker keeps in memory between their tasks; 0 replays every task.
    sticky_cache: int | None = Field(default=None, ge=0)


@dataclass(frozen=True)
class Overrides:
    """``durafix worker`` flags: apply to every queue of the process (``rate_per_s``: its activity queues)."""

    max_concurrent: int | None = None
    rate_per_s: float | None = None


NO_OVERRIDES = Overrides()


@dataclass(frozen=True)
class WorkerLimits:
    """What one queue's Temporal worker is given. ``max_concurrent`` None: the SDK's default."""

    max_concurrent: int | None
    rate_per_s: float | None
    sticky_cache: int | None


def parse_queue_settings(value: object) -> dict[TaskQueue, QueueSettings]:
    """``queue_settings`` as configured (JSON text or a mapping) by queue; :class:`SettingsError` naming the
    setting and the queue for anything that is not a valid object of known queues and keys."""
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise SettingsError(
                f'{SETTING} is not JSON ({err}); give an object such as {{"model": {{"max_concurrent": 4}}}}'
            ) from err
    if not isinstance(value, dict):
        raise SettingsError(f"{SETTING} must be a JSON object from queue name to settings, not {type(value).__name__}")
    out: dict[TaskQueue, QueueSettings] = {}
    for name, raw in value.items():
        queue = BY_SHORT_NAME.get(str(name))
        if queue is None:
            raise SettingsError(f"{SETTING} names an unknown queue {name!r}; queues: {', '.join(BY_SHORT_NAME)}")
        try:
            settings = QueueSettings.model_validate(raw)
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in err.errors())
            raise SettingsError(f"{SETTING}[{name!r}] is not valid: {problems}") from err
        if queue is not TaskQueue.ORCHESTRATION and settings.sticky_cache is not None:
            raise SettingsError(f"{SETTING}[{name!r}]: sticky_cache applies to the orchestration queue only")
        if queue is TaskQueue.ORCHESTRATION and settings.rate_per_s is not None:
            raise SettingsError(
                f"{SETTING}['orchestration']: rate_per_s limits activities, and the orchestration queue runs none"
            )
        out[queue] = settings
    return out


def worker_limits(config: DurafixConfig, queue: TaskQueue, overrides: Overrides = NO_OVERRIDES) -> WorkerLimits:
    """The limits of ``queue``'s worker: ``overrides``, else ``queue_settings``, else the defaults (activity
    queues: 8 at once, no rate limit; orchestration: the SDK's workflow-task limit and
    ``max_cached_workflows``). :class:`SettingsError` when the settings are invalid."""
    settings = parse_queue_settings(config.queue_settings).get(queue, QueueSettings())
    max_concurrent = overrides.max_concurrent or settings.max_concurrent
    if queue is TaskQueue.ORCHESTRATION:
        sticky = config.max_cached_workflows if settings.sticky_cache is None else settings.sticky_cache
        if max_concurrent is not None and sticky > 0 and max_concurrent < MIN_WORKFLOW_TASKS_WITH_CACHE:
            raise SettingsError(
                f"the orchestration worker needs max_concurrent {MIN_WORKFLOW_TASKS_WITH_CACHE} or more while its "
                f"sticky cache is on (sticky_cache {sticky}); raise it or set sticky_cache to 0"
            )
        return WorkerLimits(max_concurrent=max_concurrent, rate_per_s=None, sticky_cache=sticky)
    return WorkerLimits(
        max_concurrent=max_concurrent or DEFAULT_MAX_CONCURRENT_ACTIVITIES,
        rate_per_s=overrides.rate_per_s or settings.rate_per_s,
        sticky_cache=None,
    )
