"""Every step the workflow calls is declared once, and the worker registers exactly those, on the declared
queue, with the declared input and output types: a call site cannot disagree with its activity."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path

from temporalio import activity

from pipeline.config import DurafixConfig
from pipeline.services import Services
from pipeline.steps import STEPS, TaskQueue
from pipeline.worker.runner import activities_for


def registered(tmp_path: Path) -> dict[str, tuple[TaskQueue, typing.Callable[..., object]]]:
    services = Services(DurafixConfig(state_dir=tmp_path / "state", evidence_url=(tmp_path / "ev").as_uri()))
    found: dict[str, tuple[TaskQueue, typing.Callable[..., object]]] = {}
    for queue in TaskQueue:
        for fn in activities_for(queue, services):
            name = activity._Definition.must_from_callable(fn).name
            assert name is not None, f"{fn} is registered without a name"
            assert name not in found, f"{name} registered twice ({found[name][0]} and {queue})"
            found[name] = (queue, fn)
    return found


def test_the_worker_registers_every_declared_step_and_nothing_else(tmp_path: Path) -> None:
    assert set(registered(tmp_path)) == {step.name for step in STEPS}
    assert len({step.name for step in STEPS}) == len(STEPS)


def test_each_step_is_served_on_its_queue_with_its_declared_annotations(tmp_path: Path) -> None:
    served = registered(tmp_path)
    for step in STEPS:
        queue, fn = served[step.name]
        assert queue == step.queue, f"{step.name} is declared on {step.queue} but served on {queue}"
        hints = typing.get_type_hints(fn)
        params = list(inspect.signature(fn).parameters)
        assert len(params) == 1, f"{step.name} takes {params}, activities take one input model"
        assert hints[params[0]] is step.input, f"{step.name} takes {hints[params[0]]}, declared {step.input}"
        assert hints["return"] is step.output, f"{step.name} returns {hints['return']}, declared {step.output}"


def test_the_orchestration_queue_serves_no_activities(tmp_path: Path) -> None:
    services = Services(DurafixConfig(state_dir=tmp_path / "state"))
    assert list(activities_for(TaskQueue.ORCHESTRATION, services)) == []
