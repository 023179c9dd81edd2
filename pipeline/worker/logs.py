"""The worker's log lines: JSON by default, each naming the run, step, attempt and host it was logged for.

Contract (``durafix worker``, supervisor and polling child alike, once :func:`install` ran):

- Every record the process logs through :mod:`logging` (the worker's own lines, the activities', the capability
  packages', the Temporal SDK's Python loggers) goes to stderr as one line. ``DURAFIX_LOG_FORMAT=json``
  (the default): a JSON object (:mod:`pipeline.json_logs`) with ``msg`` and ``run``, ``step``, ``attempt``,
  ``host``. ``text``: ``time level logger [run step #attempt] msg`` for a person reading a terminal.
- ``run`` is the run's ID (its workflow ID; a repair attempt's child workflow logs its run's), ``step`` the
  activity type (``workflow`` for the workflow's own records), ``attempt`` the activity's (or workflow
  task's) attempt: read from the record's Temporal details when the SDK's loggers attached them, else from
  the activity running on the logging thread. A record logged outside any run has them ``null`` (and no
  bracket in text). ``host`` is the worker's host identity (:func:`pipeline.hosts.host_id`) on every line.
- Every activity attempt is logged as it starts and ends (:class:`StepLogInterceptor`), so each step of a run
  has its lines.
- Any other ``DURAFIX_LOG_FORMAT`` is refused (:class:`LogFormatError`) before the worker starts.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from temporalio import activity, workflow
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from pipeline.config import SettingsError
from pipeline.ids import run_of
from pipeline.json_logs import JsonFormatter, to_stderr

FORMAT_VARIABLE = "DURAFIX_LOG_FORMAT"
FORMATS = ("json", "text")
LOGGER_NAME = "durafix.worker"


class LogFormatError(SettingsError):
    """``DURAFIX_LOG_FORMAT`` names no format this worker writes."""


@dataclass(frozen=True)
class RunContext:
    """Which run, step and attempt a record belongs to (all ``None`` outside a run)."""

    run: str | None = None
    step: str | None = None
    attempt: int | None = None


def run_context(record: logging.LogRecord) -> RunContext:
    """The record's run, step and attempt (see the module's contract); a repair attempt's child workflow is
    named by its run."""
    found = _context(record)
    return dataclasses.replace(found, run=run_of(found.run)) if found.run is not None else found


def _context(record: logging.LogRecord) -> RunContext:
    details = getattr(record, "temporal_activity", None)
    if isinstance(details, dict):
        return RunContext(details.get("workflow_id"), details.get("activity_type"), details.get("attempt"))
    details = getattr(record, "temporal_workflow", None)
    if isinstance(details, dict):
        return RunContext(details.get("workflow_id"), "workflow", details.get("attempt"))
    if activity.in_activity():
        info = activity.info()
        return RunContext(info.workflow_id, info.activity_type, info.attempt)
    return RunContext()


class RunJsonFormatter(JsonFormatter):
    """A worker's record as JSON with ``msg``, ``run``, ``step``, ``attempt`` and ``host``."""

    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        context = run_context(record)
        return {
            **super().fields(record),
            "run": context.run,
            "step": context.step,
            "attempt": context.attempt,
            "host": self.host,
        }


class RunTextFormatter(logging.Formatter):
    """A worker's record as one line for people: ``time level logger [run step #attempt] msg`` (and the
    traceback of an exception below it)."""

    def format(self, record: logging.LogRecord) -> str:
        context = run_context(record)
        where = f" [{context.run} {context.step} #{context.attempt}]" if context.run is not None else ""
        text = f"{self.formatTime(record)} {record.levelname} {record.name}{where} {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def log_format() -> str:
    """The format ``DURAFIX_LOG_FORMAT`` asks for (``json`` unset); :class:`LogFormatError` for another."""
    chosen = os.environ.get(FORMAT_VARIABLE, "").strip().lower() or "json"
    if chosen not in FORMATS:
        raise LogFormatError(f"{FORMAT_VARIABLE}={chosen!r}: choose {' or '.join(FORMATS)}")
    return chosen


def install(host: str) -> None:
    """Send every record of this process to stderr in the chosen format (see the module), at INFO and above.
    In JSON the SDK's loggers stop appending their details to the message: the line's fields carry them."""
    if log_format() == "json":
        formatter: logging.Formatter = RunJsonFormatter(host)
        activity.logger.activity_info_on_message = False
        workflow.logger.workflow_info_on_message = False
    else:
        formatter = RunTextFormatter()
    to_stderr(logging.getLogger(), formatter, logging.INFO, propagate=True)
    # One line per HTTP request (the model's, the forge's) at INFO says nothing the spans do not.
    logging.getLogger("httpx").setLevel(logging.WARNING)


class StepLogInterceptor(Interceptor):
    """Logs each activity attempt this process runs as it starts and as it ends (how, and in how many
    seconds), so a run's steps can be followed in the worker's log: ``step started``, ``step finished in 1.2
    s`` or ``step failed after 0.4 s: <error type>`` (the type only: an error's message may quote a repository's
    output)."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _StepLogging(next)


class _StepLogging(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        log = worker_logger()
        log.info("step started")
        started = time.monotonic()
        try:
            result = await super().execute_activity(input)
        except BaseException as err:
            log.warning("step failed after %.1f s: %s", time.monotonic() - started, _error_type(err))
            raise
        log.info("step finished in %.1f s", time.monotonic() - started)
        return result


def _error_type(err: BaseException) -> str:
    """An ``ApplicationError``'s failure class (its type), else the exception's class name."""
    kind = getattr(err, "type", None)
    return kind if isinstance(kind, str) and kind else type(err).__name__


def worker_logger() -> logging.Logger:
    """The logger of the worker's own lines (started, polling, stopping, in-flight sweeps)."""
    return logging.getLogger(LOGGER_NAME)
