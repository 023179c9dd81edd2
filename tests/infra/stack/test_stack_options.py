"""``durafix dev up`` with options other than the running stack's: refused before anything starts, naming
each difference and ``durafix dev down``; options left out are the running stack's."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import processes, stack
from infra.processes import ServiceRecord
from infra.stack import StackConflict, StackOptions, StackState
from pipeline.cli import run_command
from pipeline.cli.command import CliError

SCRIPT = stack.DEFAULT_MODEL_SCRIPT.resolve()
OTHER_SCRIPT = (stack.DEFAULT_MODEL_SCRIPT.parent / "bad-fix.yaml").resolve()


def _sleeper(tmp_path: Path, name: str) -> ServiceRecord:
    return processes.spawn(
        name, [sys.executable, "-c", "import time; time.sleep(120)"], log=tmp_path / f"{name}.log", port=0, url=""
    )


@pytest.fixture
def running_model(tmp_path: Path) -> Iterator[tuple[Path, ServiceRecord]]:
    """A state directory whose stack has a live model server answering from the cart's fix script, started
    with local evidence and local environments (a stand-in process: the refusal comes before any is used)."""
    state = tmp_path / "state"
    state.mkdir()
    model = _sleeper(tmp_path, "model")
    model.extra["script"] = str(SCRIPT)
    recorded = StackState(services={"model": model}, options=StackOptions(model_script=str(SCRIPT)))
    (state / "stack.json").write_text(recorded.model_dump_json())
    try:
        yield state, model
    finally:
        processes.stop(model, grace_s=2)


def test_another_model_script_evidence_store_or_provider_is_refused_and_nothing_changes(
    running_model: tuple[Path, ServiceRecord],
) -> None:
    state, model = running_model
    before = (state / "stack.json").read_text()

    with pytest.raises(StackConflict) as refused:
        stack.up(state, model_script=OTHER_SCRIPT, evidence="s3", environments="docker", quiet=True)

    assert refused.value.differences == [
        f"the model server answers from {SCRIPT}, not {OTHER_SCRIPT}",
        "evidence is local, not s3",
        "environments are local, not docker",
    ]
    assert "stop it with `durafix dev down`" in str(refused.value)
    assert (state / "stack.json").read_text() == before
    assert not (state / "config.json").exists()
    assert processes.is_alive(model)


@pytest.mark.parametrize(
    ("option", "difference"),
    [
        ({"evidence": "s3"}, "evidence is local, not s3"),
        ({"environments": "docker"}, "environments are local, not docker"),
        ({"model_script": OTHER_SCRIPT}, f"the model server answers from {SCRIPT}, not {OTHER_SCRIPT}"),
    ],
)
def test_each_option_alone_is_compared(
    running_model: tuple[Path, ServiceRecord], option: dict[str, object], difference: str
) -> None:
    state, _ = running_model

    with pytest.raises(StackConflict) as refused:
        stack.up(state, quiet=True, **option)  # type: ignore[arg-type]

    assert refused.value.differences == [difference]


def test_a_stack_state_from_before_options_were_recorded_is_read_off_its_services(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    model, s3 = _sleeper(tmp_path, "model"), _sleeper(tmp_path, "s3")
    model.extra["script"] = str(SCRIPT)
    (state / "stack.json").write_text(json.dumps({"services": {"model": model.model_dump(), "s3": s3.model_dump()}}))
    try:
        with pytest.raises(StackConflict) as refused:
            stack.up(state, model_script=OTHER_SCRIPT, evidence="local", quiet=True)
    finally:
        processes.stop(model, grace_s=2)
        processes.stop(s3, grace_s=2)

    assert refused.value.differences == [
        f"the model server answers from {SCRIPT}, not {OTHER_SCRIPT}",
        "evidence is s3, not local",
    ]


def test_dev_up_refuses_with_exit_2_and_says_how(running_model: tuple[Path, ServiceRecord]) -> None:
    state, _ = running_model

    with pytest.raises(CliError, match=r"evidence is local, not s3.*`durafix dev down`") as refused:
        run_command(["--state-dir", str(state), "dev", "up", "--evidence", "s3"])

    assert refused.value.code == 2


@pytest.mark.slow
def test_a_real_stack_keeps_its_options_and_refuses_others(tmp_path: Path) -> None:
    state = tmp_path / "state"
    try:
        first = stack.up(state, model_script=OTHER_SCRIPT, quiet=True)
        pids = {name: rec.pid for name, rec in stack.read_stack(state).services.items()}

        # Options left out are the running stack's: nothing restarts, the script stays.
        again = stack.up(state, quiet=True)
        assert {name: rec.pid for name, rec in stack.read_stack(state).services.items()} == pids
        assert again.model_base_url == first.model_base_url
        assert stack.read_stack(state).services["model"].extra["script"] == str(OTHER_SCRIPT)

        with pytest.raises(StackConflict, match=f"answers from {OTHER_SCRIPT}, not {SCRIPT}"):
            stack.up(state, model_script=SCRIPT, quiet=True)
        assert {name: rec.pid for name, rec in stack.read_stack(state).services.items()} == pids
    finally:
        assert stack.down(state, quiet=True) == []

    # Once it is down, the next stack takes the options asked for.
    try:
        stack.up(state, model_script=SCRIPT, quiet=True)
        assert stack.read_stack(state).services["model"].extra["script"] == str(SCRIPT)
    finally:
        assert stack.down(state, quiet=True) == []
