"""The worker's log lines (pipeline/worker/logs.py): JSON naming the run, step, attempt and host a record was
logged for, text for people, and no other format."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
from collections.abc import Iterator

import pytest
from temporalio import activity
from temporalio.testing import ActivityEnvironment

from pipeline.worker import logs

HOST = "worker-7"
Captured = tuple[logging.Logger, "logging.StreamHandler[io.StringIO]"]


@pytest.fixture
def captured() -> Iterator[Captured]:
    logger = logging.getLogger("tests.worker-logs")
    handler = logging.StreamHandler(io.StringIO())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger, handler
    finally:
        logger.removeHandler(handler)


def _in_activity(logger: logging.Logger, attempt: int = 3) -> None:
    """Log from inside an activity attempt of run ``repair:o/r#5``, step ``env.provision``."""
    environment = ActivityEnvironment()
    environment.info = dataclasses.replace(
        environment.info, workflow_id="repair:o/r#5", activity_type="env.provision", attempt=attempt
    )

    @activity.defn(name="env.provision")
    def provision() -> None:
        # A capability's own logger, not the SDK's: the step is read from the activity running on this thread.
        logger.warning('setup: "npm ci"\nexited 1')
        try:
            raise ValueError("output of the repository's code")
        except ValueError:
            logger.exception("setup failed")

    environment.run(provision)


def _lines(handler: logging.StreamHandler[io.StringIO]) -> list[str]:
    return handler.stream.getvalue().splitlines()


def test_a_record_logged_in_an_activity_is_one_json_line_naming_run_step_attempt_and_host(captured: Captured) -> None:
    logger, handler = captured
    handler.setFormatter(logs.RunJsonFormatter(HOST))
    _in_activity(logger)
    first, second = (json.loads(line) for line in _lines(handler))
    assert first["msg"] == 'setup: "npm ci"\nexited 1'
    assert (first["run"], first["step"], first["attempt"], first["host"]) == ("repair:o/r#5", "env.provision", 3, HOST)
    assert first["level"] == "warning" and first["logger"] == "tests.worker-logs"
    # An exception is its type and where it was raised, never its message.
    assert second["error"] == "ValueError" and "output of the repository" not in json.dumps(second)


def test_a_record_outside_any_run_names_no_run_but_the_host(captured: Captured) -> None:
    logger, handler = captured
    handler.setFormatter(logs.RunJsonFormatter(HOST))
    logger.info("durafix worker polling durafix-forge")
    (line,) = (json.loads(text) for text in _lines(handler))
    assert line["msg"] == "durafix worker polling durafix-forge"
    assert (line["run"], line["step"], line["attempt"], line["host"]) == (None, None, None, HOST)


def test_the_sdk_s_details_on_a_record_name_the_run_when_no_activity_runs_on_the_thread(captured: Captured) -> None:
    logger, handler = captured
    handler.setFormatter(logs.RunJsonFormatter(HOST))
    logger.warning("host gone", extra={"temporal_workflow": {"workflow_id": "repair:o/r#9", "attempt": 2}})
    # A repair attempt runs as a child workflow of its own ID: its lines name the run.
    logger.warning("turn", extra={"temporal_workflow": {"workflow_id": "repair:o/r#9~2:attempt-3", "attempt": 1}})
    first, second = (json.loads(text) for text in _lines(handler))
    assert (first["run"], first["step"], first["attempt"]) == ("repair:o/r#9", "workflow", 2)
    assert (second["run"], second["step"], second["attempt"]) == ("repair:o/r#9~2", "workflow", 1)


def test_text_lines_are_for_people(captured: Captured) -> None:
    logger, handler = captured
    handler.setFormatter(logs.RunTextFormatter())
    _in_activity(logger, attempt=1)
    text = handler.stream.getvalue()
    assert 'WARNING tests.worker-logs [repair:o/r#5 env.provision #1] setup: "npm ci"' in text
    assert not text.lstrip().startswith("{")


def test_the_format_is_json_unless_text_is_asked_for_and_nothing_else_is_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(logs.FORMAT_VARIABLE, raising=False)
    assert logs.log_format() == "json"
    monkeypatch.setenv(logs.FORMAT_VARIABLE, "TEXT")
    assert logs.log_format() == "text"
    monkeypatch.setenv(logs.FORMAT_VARIABLE, "logfmt")
    with pytest.raises(logs.LogFormatError, match="DURAFIX_LOG_FORMAT='logfmt'"):
        logs.log_format()
