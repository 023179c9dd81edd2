from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from environments.checks import SetupError
from environments.files import path_key
from environments.interface import (
    AppRecipe,
    EnvironmentHandle,
    EnvironmentStatus,
    FixtureError,
    NoAppError,
    NotReadyError,
    ReadinessProbe,
    RecoverySpec,
    RunFencedError,
)
from environments.local import LocalProcessProvider
from environments.processes import is_live, read_stat, start_time
from environments.secrets import SecretRefusedError, SecretUnavailableError
from environments.spec import load_recipe
from tests.support.gitrepo import CART_APP
from tests.support.proctree import environ_pids
from tests.support.waiting import wait_for

RUN = "repair:acme/cart#12"
OTHER_RUN = "repair:acme/cart#13"


def tagged_pids(tag: str) -> set[int]:
    """Live processes whose environment carries ``DURAFIX_TEST_TAG=<tag>`` (read from /proc)."""
    needle = f"DURAFIX_TEST_TAG={tag}".encode()
    return {pid for pid in environ_pids(lambda environ: needle in environ.split(b"\0")) if is_live(pid)}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(CART_APP, ws, ignore=shutil.ignore_patterns("__pycache__"))
    return ws


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def provider(tmp_path: Path, tag: str) -> Iterator[LocalProcessProvider]:
    prov = LocalProcessProvider(tmp_path / "state", stop_grace_s=2.0)
    yield prov
    for run in (RUN, OTHER_RUN):
        prov.cleanup_run(run)
    assert tagged_pids(tag) == set(), "a test left processes behind"


def spec_for(recipe: AppRecipe) -> RecoverySpec:
    return RecoverySpec(
        repository="acme/cart", clone_url="https://example.com/acme/cart.git", base_revision="3f" * 20, recipe=recipe
    )


def cart_spec(tag: str, **changes: object) -> RecoverySpec:
    recipe = load_recipe(CART_APP)
    recipe = recipe.model_copy(update={"env": {"DURAFIX_TEST_TAG": tag}, **changes})
    return spec_for(recipe)


def leader_pid(handle: EnvironmentHandle) -> int:
    return int(handle.resources[0].detail["pid"])


def test_provision_starts_the_cart_app_and_it_answers(
    provider: LocalProcessProvider, workspace: Path, tag: str
) -> None:
    handle = provider.provision(run_id=RUN, op_id=f"{RUN}:provision", spec=cart_spec(tag), workspace=str(workspace))

    page = httpx.get(handle.base_url + "/", trust_env=False)
    assert page.status_code == 200 and 'id="total"' in page.text
    assert provider.check(handle) is EnvironmentStatus.READY
    assert handle.provider == "local" and handle.run_id == RUN
    [resource] = provider.list_owned(RUN)
    assert resource.detail["state"] == "live" and resource.op_id == f"{RUN}:provision"
    assert "cart app listening" in Path(resource.detail["log"]).read_text()


def test_a_second_provision_for_the_same_operation_adopts_the_running_app(
    provider: LocalProcessProvider, workspace: Path, tag: str
) -> None:
    op = f"{RUN}:provision"
    first = provider.provision(run_id=RUN, op_id=op, spec=cart_spec(tag), workspace=str(workspace))
    before = tagged_pids(tag)
    second = provider.provision(run_id=RUN, op_id=op, spec=cart_spec(tag), workspace=str(workspace))

    assert second == first
    assert tagged_pids(tag) == before
    assert len(provider.list_owned(RUN)) == 1


def test_concurrent_provisions_of_one_operation_start_one_app(
    provider: LocalProcessProvider, workspace: Path, tag: str
) -> None:
    op = f"{RUN}:provision"
    with ThreadPoolExecutor(max_workers=2) as pool:
        handles = list(
            pool.map(
                lambda _: provider.provision(run_id=RUN, op_id=op, spec=cart_spec(tag), workspace=str(workspace)),
                range(2),
            )
        )
    assert handles[0] == handles[1]
    assert len(provider.list_owned(RUN)) == 1
    assert {os.getpgid(pid) for pid in tagged_pids(tag)} == {leader_pid(handles[0])}


def test_a_process_killed_behind_its_back_is_detected_and_replaced(
    provider: LocalProcessProvider, workspace: Path, tag: str
) -> None:
    op = f"{RUN}:provision"
    handle = provider.provision(run_id=RUN, op_id=op, spec=cart_spec(tag), workspace=str(workspace))
    os.killpg(leader_pid(handle), signal.SIGKILL)
    wait_for(lambda: not tagged_pids(tag), 10, "the tagged processes to end", interval_s=0.05)

    assert provider.check(handle) is EnvironmentStatus.GONE
    assert [r.detail["state"] for r in provider.list_owned(RUN)] == ["dead"]

    replaced = provider.provision(run_id=RUN, op_id=op, spec=cart_spec(tag), workspace=str(workspace))
    assert leader_pid(replaced) != leader_pid(handle)
    assert provider.check(replaced) is EnvironmentStatus.READY
    assert len(provider.list_owned(RUN)) == 1


def test_an_app_that_stops_answering_is_not_ready(provider: LocalProcessProvider, workspace: Path, tag: str) -> None:
    handle = provider.provision(run_id=RUN, op_id=f"{RUN}:provision", spec=cart_spec(tag), workspace=str(workspace))
    os.killpg(leader_pid(handle), signal.SIGSTOP)
    try:
        assert provider.check(handle) is EnvironmentStatus.NOT_READY
    finally:
        os.killpg(leader_pid(handle), signal.SIGCONT)


def test_teardown_leaves_no_process_even_one_that_left_its_group(
    provider: LocalProcessProvider, workspace: Path, tag: str
) -> None:
    spec = cart_spec(tag, start="setsid sleep 300 & exec python3 app.py --port $PORT")
    handle = provider.provision(run_id=RUN, op_id=f"{RUN}:provision", spec=spec, workspace=str(workspace))
    # The app runs in a sandbox (forwarder, bwrap, its init, then the commands): wait for the escaped sleep.
    wait_for(lambda: any(_cmdline(pid).startswith("sleep") for pid in tagged_pids(tag)), 10, "a sleep", interval_s=0.05)
    pgid = leader_pid(handle)

    report = provider.teardown(handle)

    assert report.complete and [r.op_id for r in report.removed if r.detail.get("recorded") != "no"] == [
        f"{RUN}:provision"
    ]
    assert tagged_pids(tag) == set()
    in_group = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _pgid(p) == pgid]
    assert in_group == []
    assert provider.check(handle) is EnvironmentStatus.GONE
    assert provider.list_owned(RUN) == []
    again = provider.teardown(handle)
    assert again.complete and again.removed == []


def test_cleanup_run_fences_a_late_provision(provider: LocalProcessProvider, workspace: Path, tag: str) -> None:
    provider.provision(run_id=RUN, op_id=f"{RUN}:provision", spec=cart_spec(tag), workspace=str(workspace))
    report = provider.cleanup_run(RUN)
    assert report.complete and len(report.removed) == 1

    with pytest.raises(RunFencedError):
        provider.provision(run_id=RUN, op_id=f"{RUN}:provision:2", spec=cart_spec(tag), workspace=str(workspace))
    assert tagged_pids(tag) == set()
    assert provider.list_owned(RUN) == []
    assert provider.cleanup_run(RUN).removed == []


def test_cleanup_run_removes_only_that_runs_processes(
    provider: LocalProcessProvider, workspace: Path, tag: str
) -> None:
    mine = provider.provision(run_id=RUN, op_id=f"{RUN}:provision", spec=cart_spec(tag), workspace=str(workspace))
    other_tag = uuid.uuid4().hex
    theirs = provider.provision(
        run_id=OTHER_RUN, op_id=f"{OTHER_RUN}:provision", spec=cart_spec(other_tag), workspace=str(workspace)
    )
    try:
        report = provider.cleanup_run(RUN)

        assert [r.op_id for r in report.removed] == [mine.op_id]
        assert tagged_pids(tag) == set()
        assert provider.check(theirs) is EnvironmentStatus.READY
        assert [r.detail["state"] for r in provider.list_owned(OTHER_RUN)] == ["live"]
    finally:
        provider.cleanup_run(OTHER_RUN)
    assert tagged_pids(other_tag) == set()


def test_cleanup_run_stops_marked_processes_that_were_never_recorded(
    provider: LocalProcessProvider, tmp_path: Path, tag: str
) -> None:
    # As if a worker died between spawning a process and writing its record.
    state = tmp_path / "state"

    def orphan(run_id: str, process_tag: str) -> subprocess.Popen[bytes]:
        marker = f"{path_key(run_id)}/{path_key(run_id + ':provision')}"
        env = {"PATH": os.environ["PATH"], "DURAFIX_OWNER": marker, "DURAFIX_TEST_TAG": process_tag}
        return subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)

    mine = orphan(RUN, tag)
    other_tag = uuid.uuid4().hex
    theirs = orphan(OTHER_RUN, other_tag)
    try:
        report = provider.cleanup_run(RUN)
        mine.wait(timeout=10)
        assert [r.resource_id for r in report.removed] == [f"pid:{mine.pid}"]
        assert theirs.poll() is None and tagged_pids(other_tag) == {theirs.pid}
        assert state.is_dir()
    finally:
        theirs.kill()
        theirs.wait()
        mine.kill()
        mine.wait()


def test_secrets_reach_the_app_but_never_the_records(
    provider: LocalProcessProvider, workspace: Path, tag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CART_API_KEY_SOURCE", "s3cr3t-value-41")
    monkeypatch.setenv("WORKER_ONLY_CREDENTIAL", "worker-credential-7")
    spec = cart_spec(tag, secrets={"API_KEY": "env:CART_API_KEY_SOURCE"})
    provider = LocalProcessProvider(tmp_path / "state", stop_grace_s=2.0, allowed_secrets=["CART_API_KEY_SOURCE"])
    handle = provider.provision(run_id=RUN, op_id=f"{RUN}:provision", spec=spec, workspace=str(workspace))

    environ = Path(f"/proc/{leader_pid(handle)}/environ").read_bytes().split(b"\0")
    assert b"API_KEY=s3cr3t-value-41" in environ
    assert httpx.get(handle.base_url + "/healthz", trust_env=False).status_code == 200
    assert not any(b"worker-credential-7" in entry for entry in environ)
    assert b"s3cr3t-value-41" not in handle.model_dump_json().encode()
    for path in (tmp_path / "state").rglob("*"):
        if path.is_file():
            assert b"s3cr3t-value-41" not in path.read_bytes(), path


def test_a_missing_secret_starts_nothing(workspace: Path, tag: str, tmp_path: Path) -> None:
    provider = LocalProcessProvider(tmp_path / "state", stop_grace_s=2.0, allowed_secrets=["CART_TEST_SURELY_UNSET"])
    spec = cart_spec(tag, secrets={"API_KEY": "env:CART_TEST_SURELY_UNSET"})
    with pytest.raises(SecretUnavailableError, match="CART_TEST_SURELY_UNSET"):
        provider.provision(run_id=RUN, op_id=f"{RUN}:provision", spec=spec, workspace=str(workspace))
    assert tagged_pids(tag) == set() and provider.list_owned(RUN) == []


def test_a_recipe_without_start_is_refused_before_anything_is_created(
    provider: LocalProcessProvider, workspace: Path, tag: str
) -> None:
    """No ``start``: no app to provision. Refused before the setup runs, a process starts or the run's
    directory (record, log, locks) exists; the workspace is as it was."""
    spec = cart_spec(tag, start=None, setup=["echo set up > setup-done"])
    before = sorted(p.relative_to(workspace) for p in workspace.rglob("*"))
    states: list[str] = []
    with pytest.raises(NoAppError, match=r"durafix\.yaml declares no `start`") as refused:
        provider.provision(
            run_id=RUN, op_id=f"{RUN}:provision", spec=spec, workspace=str(workspace), progress=states.append
        )
    assert refused.value.failed is not None and refused.value.failed.command == ""
    assert states == [] and tagged_pids(tag) == set() and provider.list_owned(RUN) == []
    assert not provider.runs.run_dir(RUN).exists()
    assert sorted(p.relative_to(workspace) for p in workspace.rglob("*")) == before


def test_a_secret_the_operator_did_not_allow_or_of_durafix_own_is_refused(
    provider: LocalProcessProvider, workspace: Path, tag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CART_API_KEY_SOURCE", "s3cr3t-value-41")
    for variable in ("CART_API_KEY_SOURCE", "DURAFIX_FORGE_TOKEN", "OPENAI_API_KEY"):
        spec = cart_spec(tag, secrets={"STOLEN": f"env:{variable}"})
        with pytest.raises(SecretRefusedError, match=variable):
            provider.provision(run_id=RUN, op_id=f"{RUN}:provision", spec=spec, workspace=str(workspace))
    assert tagged_pids(tag) == set() and provider.list_owned(RUN) == []
    # Allow-listing durafix's own token is refused when the provider is built, not when a run needs it.
    with pytest.raises(ValueError, match="DURAFIX_FORGE_TOKEN"):
        LocalProcessProvider(tmp_path / "other", allowed_secrets=["DURAFIX_FORGE_TOKEN"])


def test_setup_commands_run_in_the_workspace_before_the_start_command(
    provider: LocalProcessProvider, workspace: Path, tag: str
) -> None:
    spec = cart_spec(
        tag,
        setup=["echo prepared > setup-done", "echo step two >> setup-done"],
        start="test -f setup-done && exec python3 app.py --port $PORT",
    )
    handle = provider.provision(run_id=RUN, op_id=f"{RUN}:provision", spec=spec, workspace=str(workspace))
    assert provider.check(handle) is EnvironmentStatus.READY
    assert (workspace / "setup-done").read_text() == "prepared\nstep two\n"


def test_a_failing_setup_command_is_reported_with_its_output(
    provider: LocalProcessProvider, workspace: Path, tag: str
) -> None:
    spec = cart_spec(tag, setup=["echo broken dependency >&2; exit 7"])
    with pytest.raises(SetupError, match="exited 7") as info:
        provider.provision(run_id=RUN, op_id=f"{RUN}:provision", spec=spec, workspace=str(workspace))
    assert "broken dependency" in str(info.value)
    assert provider.list_owned(RUN) == []


# A fixture that needs the app up: it reads the app's cart over HTTP, then records that it ran.
SEED = (
    "python3 -c \"import os, urllib.request; urllib.request.urlopen(os.environ['DURAFIX_APP_URL'] + '/api/cart')\""
    " && echo seeded on port $PORT >> seeded"
)


def test_fixtures_run_once_against_the_ready_app_and_adoption_does_not_rerun_them(
    provider: LocalProcessProvider, workspace: Path, tag: str
) -> None:
    spec = cart_spec(tag, fixtures=[SEED, "echo second >> seeded"])
    op = f"{RUN}:provision"
    handle = provider.provision(run_id=RUN, op_id=op, spec=spec, workspace=str(workspace))
    port = handle.base_url.rsplit(":", 1)[1]
    assert (workspace / "seeded").read_text() == f"seeded on port {port}\nsecond\n"

    again = provider.provision(run_id=RUN, op_id=op, spec=spec, workspace=str(workspace))
    assert again == handle
    assert (workspace / "seeded").read_text() == f"seeded on port {port}\nsecond\n"


class ProgressLog:
    """A progress callback that keeps each text with the moment it arrived."""

    def __init__(self) -> None:
        self.events: list[tuple[str, float]] = []

    def __call__(self, text: str) -> None:
        self.events.append((text, time.monotonic()))

    @property
    def texts(self) -> list[str]:
        return [text for text, _ in self.events]

    def at(self, text: str) -> float:
        return next(moment for said, moment in self.events if said == text)


def test_provision_reports_each_sub_state_in_order_and_adoption_reports_adopting(
    provider: LocalProcessProvider, workspace: Path, tag: str
) -> None:
    start = "exec python3 app.py --port $PORT"
    spec = cart_spec(tag, setup=["sleep 1", "true"], start=start, fixtures=[SEED, "echo second >> seeded"])
    op = f"{RUN}:provision"
    progress = ProgressLog()

    handle = provider.provision(run_id=RUN, op_id=op, spec=spec, workspace=str(workspace), progress=progress)

    # SEED is longer than a sub-state may be: it is cut to 80 characters, the last one an ellipsis.
    assert len(SEED) > 80 and "  " not in SEED
    assert progress.texts == [
        "setup: sleep 1",
        "setup: true",
        f"starting app: {start}",
        f"waiting for readiness at {handle.base_url}/healthz",
        f"fixtures: {SEED[:79]}…",
        "fixtures: echo second >> seeded",
    ]
    # Each text is sent as its step begins: the second setup command is announced after the first has run.
    assert progress.at("setup: true") - progress.at("setup: sleep 1") >= 1.0

    adoption = ProgressLog()
    assert provider.provision(run_id=RUN, op_id=op, spec=spec, workspace=str(workspace), progress=adoption) == handle
    assert adoption.texts == [f"adopting {handle.env_id}"]


def test_replacing_a_dead_app_reports_stopping_it_before_starting_anew(
    provider: LocalProcessProvider, workspace: Path, tag: str
) -> None:
    op = f"{RUN}:provision"
    spec = cart_spec(tag)
    dead = provider.provision(run_id=RUN, op_id=op, spec=spec, workspace=str(workspace))
    os.killpg(leader_pid(dead), signal.SIGKILL)
    wait_for(lambda: not tagged_pids(tag), 10, "the tagged processes to end", interval_s=0.05)
    progress = ProgressLog()

    replaced = provider.provision(run_id=RUN, op_id=op, spec=spec, workspace=str(workspace), progress=progress)

    assert progress.texts == [
        f"stopping earlier {dead.env_id}",
        f"starting app: {spec.recipe.start}",
        f"waiting for readiness at {replaced.base_url}/healthz",
    ]


def test_a_failing_fixture_stops_the_app_and_the_next_provision_seeds_a_fresh_one(
    provider: LocalProcessProvider, workspace: Path, tag: str
) -> None:
    op = f"{RUN}:provision"
    failing = cart_spec(tag, fixtures=[SEED, "echo no seed data >&2; exit 3"])
    with pytest.raises(FixtureError, match="exited 3") as info:
        provider.provision(run_id=RUN, op_id=op, spec=failing, workspace=str(workspace))
    assert "no seed data" in str(info.value)
    assert provider.list_owned(RUN) == []
    wait_for(lambda: tagged_pids(tag) == set(), 10, "the tagged processes to end", interval_s=0.05)

    handle = provider.provision(run_id=RUN, op_id=op, spec=cart_spec(tag, fixtures=[SEED]), workspace=str(workspace))
    assert provider.check(handle) is EnvironmentStatus.READY
    assert (workspace / "seeded").read_text().count("seeded on port") == 2


def test_an_app_whose_seeding_never_finished_is_replaced_not_adopted(
    provider: LocalProcessProvider, workspace: Path, tag: str
) -> None:
    op = f"{RUN}:provision"
    spec = cart_spec(tag, fixtures=[SEED])
    first = provider.provision(run_id=RUN, op_id=op, spec=spec, workspace=str(workspace))
    # As if the worker died between starting the app and finishing its fixtures: the record lacks the mark.
    record_path = provider.state_dir / path_key(RUN) / f"{path_key(op)}.json"
    record = json.loads(record_path.read_text())
    del record["seeded"]
    record_path.write_text(json.dumps(record))

    second = provider.provision(run_id=RUN, op_id=op, spec=spec, workspace=str(workspace))
    assert leader_pid(second) != leader_pid(first)
    # The half-seeded app was stopped, not merely forgotten.
    assert {os.getpgid(pid) for pid in tagged_pids(tag)} == {leader_pid(second)}
    assert (workspace / "seeded").read_text().count("seeded on port") == 2
    assert len(provider.list_owned(RUN)) == 1


def test_an_app_that_never_becomes_ready_is_stopped(provider: LocalProcessProvider, workspace: Path, tag: str) -> None:
    spec = cart_spec(tag, start="exec sleep 300", readiness=ReadinessProbe(path="/healthz", deadline_s=1.0))
    with pytest.raises(NotReadyError, match="/healthz"):
        provider.provision(run_id=RUN, op_id=f"{RUN}:provision", spec=spec, workspace=str(workspace))
    assert tagged_pids(tag) == set()
    assert provider.list_owned(RUN) == []


def test_an_app_that_exits_at_start_is_reported_with_its_output(
    provider: LocalProcessProvider, workspace: Path, tag: str
) -> None:
    spec = cart_spec(tag, start="echo cannot open database; exit 3")
    with pytest.raises(NotReadyError, match="cannot open database"):
        provider.provision(run_id=RUN, op_id=f"{RUN}:provision", spec=spec, workspace=str(workspace))


def test_ownership_records_hold_identity_but_no_environment(
    provider: LocalProcessProvider, workspace: Path, tag: str, tmp_path: Path
) -> None:
    handle = provider.provision(run_id=RUN, op_id=f"{RUN}:provision", spec=cart_spec(tag), workspace=str(workspace))
    record_path = tmp_path / "state" / path_key(RUN) / f"{path_key(handle.op_id)}.json"
    record = json.loads(record_path.read_text())
    pid = leader_pid(handle)
    assert (record["pid"], record["pgid"], record["start_time"]) == (pid, pid, start_time(pid))
    assert record["op_id"] == handle.op_id and handle.base_url.endswith(f":{record['port']}")
    assert tag not in record_path.read_text()


def _pgid(proc_dir: Path) -> int | None:
    stat = read_stat(int(proc_dir.name))
    return stat.pgid if stat is not None else None
