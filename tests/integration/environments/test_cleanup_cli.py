"""The on-call commands ``durafix resources`` and ``durafix cleanup`` against real parts: the sample cart app
started as real processes by the local provider, workspaces rebuilt from a real git repository, and run
statuses from the real Temporal dev server (one run completed, one left running, one it never heard of)."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from environments.files import path_key
from environments.interface import RecoverySpec
from environments.local import LocalProcessProvider
from environments.ports import free_port
from environments.processes import is_running
from environments.spec import load_recipe
from environments.workspace import WorkspaceManager
from pipeline.cli import run_command
from pipeline.config import DurafixConfig
from tests.integration.environments.test_local_provider import tagged_pids
from tests.support.durafix_cli import run_durafix
from tests.support.gitrepo import Repo, make_repo

Main = Callable[[list[str]], int]


def durafix_cleanup(argv: list[str]) -> int:
    """``durafix cleanup ARGV`` in this process, on the state directory ``$DURAFIX_STATE_DIR`` names."""
    return run_command(["cleanup", *argv])


def durafix_resources(argv: list[str]) -> int:
    """``durafix resources ARGV`` in this process, on the state directory ``$DURAFIX_STATE_DIR`` names."""
    return run_command(["resources", *argv])


@workflow.defn(name="cleanup_cli_waiter")
class WaitForFinish:
    """A run that stays RUNNING until it is told to finish."""

    def __init__(self) -> None:
        self._done = False

    @workflow.run
    async def run(self) -> str:
        await workflow.wait_condition(lambda: self._done)
        return "done"

    @workflow.signal
    def finish(self) -> None:
        self._done = True


@dataclass(frozen=True)
class Runs:
    finished: str
    running: str
    unknown: str

    def all(self) -> tuple[str, str, str]:
        return (self.finished, self.running, self.unknown)


@pytest.fixture
async def runs(temporal_client: Client) -> AsyncIterator[Runs]:
    repo = f"acme/shop-{uuid.uuid4().hex[:8]}"
    ids = Runs(finished=f"repair:{repo}#1", running=f"repair:{repo}#2", unknown=f"repair:{repo}#3")
    queue = f"cleanup-cli-{uuid.uuid4().hex}"
    async with Worker(
        temporal_client, task_queue=queue, workflows=[WaitForFinish], workflow_runner=UnsandboxedWorkflowRunner()
    ):
        finished = await temporal_client.start_workflow(WaitForFinish.run, id=ids.finished, task_queue=queue)
        await temporal_client.start_workflow(WaitForFinish.run, id=ids.running, task_queue=queue)
        await finished.signal(WaitForFinish.finish)
        assert await finished.result() == "done"
    yield ids
    await temporal_client.get_workflow_handle(ids.running).terminate("test over")


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state directory the commands read (through ``$DURAFIX_STATE_DIR``), with only local environments."""
    state_dir = tmp_path / "state"
    DurafixConfig(state_dir=state_dir).save()
    for var in ("DURAFIX_TEMPORAL_ADDRESS", "DURAFIX_TEMPORAL_NAMESPACE", "DURAFIX_DOCKER_HOST", "DOCKER_HOST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DURAFIX_ENVIRONMENT_PROVIDER", "local")
    monkeypatch.setenv("DURAFIX_STATE_DIR", str(state_dir))
    return state_dir


@dataclass
class Owned:
    """What each run owns: its app process (leader pid + start time + port) and its workspace tree."""

    process: dict[str, tuple[int, int, int]]
    tree: dict[str, Path]
    repo: Repo

    def alive(self, run_id: str) -> bool:
        pid, start_time, _ = self.process[run_id]
        return is_running(pid, start_time)

    def answers(self, run_id: str) -> bool:
        port = self.process[run_id][2]
        return httpx.get(f"http://127.0.0.1:{port}/healthz", trust_env=False).status_code == 200


@pytest.fixture
def owned(state: Path, runs: Runs, temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Owned]:
    """Each run's app process and workspace, with the commands pointed at the Temporal dev server."""
    DurafixConfig(state_dir=state, temporal_address=temporal_env.client.service_client.config.target_host).save()
    tag = uuid.uuid4().hex
    repo = make_repo(tmp_path / "repo")
    provider = LocalProcessProvider(state / "environments", stop_grace_s=2.0)
    workspaces = WorkspaceManager(cache_dir=state / "cache", root=state / "workspaces")
    result = Owned(process={}, tree={}, repo=repo)
    try:
        for run_id in runs.all():
            ws = workspaces.rebuild(
                run_id=run_id, op_id=f"{run_id}:workspace", clone_url=repo.url, base_revision=repo.base
            )
            recipe = load_recipe(ws.path).model_copy(update={"env": {"DURAFIX_TEST_TAG": tag}})
            spec = RecoverySpec(repository="acme/shop", clone_url=repo.url, base_revision=repo.base, recipe=recipe)
            handle = provider.provision(run_id=run_id, op_id=f"{run_id}:provision", spec=spec, workspace=str(ws.path))
            [process] = handle.resources
            start_time = int(process.resource_id.rsplit("@", 1)[1])
            result.process[run_id] = (int(process.detail["pid"]), start_time, int(process.detail["port"]))
            result.tree[run_id] = ws.path
        yield result
    finally:
        for run_id in runs.all():
            provider.cleanup_run(run_id)
            workspaces.cleanup_run(run_id)
        assert tagged_pids(tag) == set(), "a test left app processes behind"


async def cli(main: Main, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run a command in a worker thread (it runs its own event loop); return code, stdout, stderr."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def json_of(main: Main, argv: list[str], capsys: pytest.CaptureFixture[str]) -> Any:
    """The JSON document a command printed, which exited 0."""
    code, out, _ = await cli(main, argv, capsys)
    assert code == 0
    return json.loads(out)


def owners(resources: list[dict[str, object]]) -> set[tuple[object, object]]:
    return {(r["run_id"], r["kind"]) for r in resources}


@pytest.mark.slow
async def test_resources_lists_each_runs_process_and_workspace(
    owned: Owned, runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    document = await json_of(durafix_resources, ["--json"], capsys)
    assert document["unavailable"] == []
    assert owners(document["resources"]) == {(run, kind) for run in runs.all() for kind in ("process", "workspace")}
    by_kind = {(r["run_id"], r["kind"]): r for r in document["resources"]}
    assert by_kind[(runs.running, "process")]["detail"]["state"] == "live"
    assert by_kind[(runs.running, "workspace")]["resource_id"] == str(owned.tree[runs.running])

    code, out, _ = await cli(durafix_resources, ["--run", runs.running.removeprefix("repair:")], capsys)

    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["PROVIDER", "KIND", "RESOURCE", "RUN", "OP", "STATUS"]
    assert len(rows) == 2 and all(runs.running in row for row in rows)
    pid = owned.process[runs.running][0]
    assert any(f"pid:{pid}@" in row and "provision" in row and "live" in row for row in rows)


@pytest.mark.slow
async def test_dry_runs_list_their_targets_and_remove_nothing(
    owned: Owned, runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    document = await json_of(durafix_cleanup, ["--run", runs.finished, "--json"], capsys)
    assert document["dry_run"] is True and document["temporal_status"] == "completed"
    assert owners(document["resources"]) == {(runs.finished, "process"), (runs.finished, "workspace")}

    code, out, _ = await cli(durafix_cleanup, ["--orphans"], capsys)

    assert code == 0
    assert "dry run, nothing was changed" in out and str(owned.tree[runs.unknown]) in out
    assert all(owned.alive(run) and owned.tree[run].is_dir() for run in runs.all())


@pytest.mark.slow
async def test_cleanup_of_one_run_removes_only_that_runs_resources(
    owned: Owned, runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    document = await json_of(durafix_cleanup, ["--run", runs.finished, "--yes", "--json"], capsys)
    assert owners(document["removed"]) == {(runs.finished, "process"), (runs.finished, "workspace")}
    assert document["remaining"] == [] and document["errors"] == []
    assert not owned.alive(runs.finished) and not owned.tree[runs.finished].exists()
    assert owned.alive(runs.running) and owned.answers(runs.running) and owned.tree[runs.running].is_dir()
    assert owned.alive(runs.unknown) and owned.tree[runs.unknown].is_dir()

    code, _, err = await cli(durafix_cleanup, ["--run", runs.finished, "--yes"], capsys)

    assert code == 3 and "owns no resources" in err
    code, out, _ = await cli(durafix_resources, ["--run", runs.finished], capsys)
    assert code == 3 and "no resources owned by" in out


@pytest.mark.slow
async def test_a_running_run_is_cleaned_only_with_force(
    owned: Owned, runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = await cli(durafix_cleanup, ["--run", runs.running, "--yes"], capsys)

    assert code == 2
    assert "refusing without --force" in err and "still running" in err
    assert owned.alive(runs.running) and owned.tree[runs.running].is_dir()

    code, out, _ = await cli(durafix_cleanup, ["--run", runs.running, "--yes", "--force"], capsys)

    assert code == 0 and "clean; 2 removed, 0 remaining" in out
    assert not owned.alive(runs.running) and not owned.tree[runs.running].exists()
    assert owned.alive(runs.finished) and owned.alive(runs.unknown)


@pytest.mark.slow
async def test_orphans_are_the_finished_and_unknown_runs_never_the_running_one(
    state: Path, owned: Owned, runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    # Owned under a label no workflow could carry: Temporal cannot vouch for it, so it is never a target.
    workspaces = WorkspaceManager(cache_dir=state / "cache", root=state / "workspaces")
    stray = workspaces.rebuild(
        run_id="manual-experiment", op_id="manual", clone_url=owned.repo.url, base_revision=owned.repo.base
    )

    document = await json_of(durafix_cleanup, ["--orphans", "--json"], capsys)
    planned = {t["run_id"]: t["temporal_status"] for t in document["targets"] if t["run_id"] in runs.all()}
    assert planned == {runs.finished: "completed", runs.unknown: "not-found"}
    kept = {k["run_id"]: k for k in document["kept"]}
    assert kept[runs.running]["temporal_status"] == "running"
    assert kept["manual-experiment"]["note"] == "not a run ID; inspect by hand"

    document = await json_of(durafix_cleanup, ["--orphans", "--yes", "--json"], capsys)
    results = {t["run_id"]: t for t in document["targets"] if t["run_id"] in runs.all()}
    assert set(results) == {runs.finished, runs.unknown}
    assert all(len(t["removed"]) == 2 and t["remaining"] == [] for t in results.values())
    assert not owned.alive(runs.finished) and not owned.alive(runs.unknown)
    assert not owned.tree[runs.finished].exists() and not owned.tree[runs.unknown].exists()
    assert owned.alive(runs.running) and owned.answers(runs.running) and owned.tree[runs.running].is_dir()
    assert stray.path.is_dir()
    workspaces.cleanup_run("manual-experiment")


@pytest.mark.slow
async def test_a_resource_that_cannot_be_removed_is_named_with_its_error_and_exit_1(
    state: Path, owned: Owned, runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    # A directory where the finished run's workspace tombstone must be written: the workspace manager cannot
    # fence that run, so it removes nothing of it.
    obstacle = state / "workspaces" / path_key(runs.finished) / "tombstone.json"
    (obstacle / "blocker").mkdir(parents=True)

    code, out, _ = await cli(durafix_cleanup, ["--orphans", "--yes"], capsys)

    assert code == 1
    assert f"{runs.finished}: INCOMPLETE; 1 removed, 1 remaining" in out
    remaining = out.split("could not be removed:", 1)[1]
    assert str(owned.tree[runs.finished]) in remaining
    assert f"error: workspace: cleanup of {runs.finished} failed" in out
    assert owned.tree[runs.finished].is_dir() and not owned.alive(runs.finished)
    # The failure did not stop the sweep: the run after it in the plan was cleaned.
    assert f"{runs.unknown}: clean; 2 removed, 0 remaining" in out
    assert not owned.alive(runs.unknown) and not owned.tree[runs.unknown].exists()
    assert owned.alive(runs.running)

    shutil.rmtree(obstacle)
    code, out, _ = await cli(durafix_cleanup, ["--run", runs.finished, "--yes"], capsys)

    assert code == 0 and "clean; 1 removed, 0 remaining" in out
    assert not owned.tree[runs.finished].exists()


@pytest.mark.slow
async def test_without_temporal_orphans_are_refused_and_a_run_needs_force(
    state: Path, owned: Owned, runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    DurafixConfig(state_dir=state, temporal_address=f"127.0.0.1:{free_port()}").save()

    for argv in (["--orphans"], ["--orphans", "--yes"]):
        code, _, err = await cli(durafix_cleanup, argv, capsys)
        assert code == 2
        assert "refusing to look for orphans: cannot reach Temporal" in err
    code, out, err = await cli(durafix_cleanup, ["--run", runs.finished], capsys)
    assert code == 0 and "cannot reach Temporal" in err and "--yes --force" in out
    code, _, err = await cli(durafix_cleanup, ["--run", runs.finished, "--yes"], capsys)
    assert code == 2 and "refusing without --force" in err
    assert all(owned.alive(run) and owned.tree[run].is_dir() for run in runs.all())

    code, _, _ = await cli(durafix_cleanup, ["--run", runs.finished, "--yes", "--force"], capsys)

    assert code == 0
    assert not owned.alive(runs.finished) and owned.alive(runs.running) and owned.alive(runs.unknown)


@pytest.mark.slow
def test_the_durafix_command_lists_resources_as_json(owned: Owned, runs: Runs, state: Path) -> None:
    proc = run_durafix(state, "resources", "--json")

    assert proc.returncode == 0, proc.stderr
    resources = json.loads(proc.stdout)["resources"]
    assert owners(resources) == {(run, kind) for run in runs.all() for kind in ("process", "workspace")}


def test_an_unreachable_docker_engine_makes_the_listing_incomplete_not_empty(
    state: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DURAFIX_DOCKER_HOST", f"tcp://127.0.0.1:{free_port()}")

    code = durafix_resources(["--json"])
    out, err = capsys.readouterr()

    assert code == 1
    [unavailable] = json.loads(out)["unavailable"]
    assert unavailable["provider"] == "docker" and "engine not reachable" in unavailable["reason"]
    assert "docker" in err


@pytest.mark.parametrize(
    ("main", "argv"),
    [
        (durafix_cleanup, []),
        (durafix_cleanup, ["--run", "acme/shop#1", "--orphans"]),
        (durafix_cleanup, ["--run", "acme/shop"]),
        (durafix_cleanup, ["--run", "acme/shop#1", "--force"]),
        (durafix_cleanup, ["--orphans", "--yes", "--force"]),
        (durafix_resources, ["--run", "shop#1"]),
    ],
)
def test_usage_errors_exit_2_before_anything_is_read(main: Main, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)

    assert exited.value.code == 2
