"""The private Docker engine: start, reuse, stop, and a failed start that explains itself."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from environments.processes import is_live
from infra.docker.engine import DockerEngine, EngineError, storage_driver
from tests.conftest import unavailable


def test_overlay2_is_chosen_when_the_kernel_has_overlayfs(tmp_path: Path) -> None:
    filesystems = tmp_path / "filesystems"
    filesystems.write_text("nodev\tsysfs\n\text4\nnodev\toverlay\n")
    assert storage_driver(filesystems) == "overlay2"


def test_vfs_is_the_fallback_without_overlayfs(tmp_path: Path) -> None:
    filesystems = tmp_path / "filesystems"
    filesystems.write_text("nodev\tsysfs\n\text4\n")
    assert storage_driver(filesystems) == "vfs"


def test_too_deep_a_state_directory_is_refused_before_starting(tmp_path: Path) -> None:
    engine = DockerEngine(tmp_path / ("d" * 120))
    with pytest.raises(EngineError, match="exceeds"):
        engine.ensure_running()
    assert not engine.pid_file.exists()


@pytest.fixture
def spare_engine(docker_engine: DockerEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerEngine]:
    """A second engine (the session's proves the prerequisites); stopped after the test whatever happens.

    Its state directory is kept short: containerd refuses socket paths over 104 bytes.
    """
    engine = DockerEngine(tmp_path_factory.mktemp("e"))
    yield engine
    engine.stop()


@pytest.mark.docker
def test_engine_starts_is_reused_and_stops(spare_engine: DockerEngine) -> None:
    try:
        host = spare_engine.ensure_running()
    except EngineError as exc:
        unavailable(str(exc))
    pid = int(spare_engine.pid_file.read_text())

    again = DockerEngine(spare_engine.state_dir)
    assert again.ensure_running() == host == f"unix://{spare_engine.state_dir}/docker.sock"
    assert spare_engine.started_here and not again.started_here

    again.stop()
    assert not spare_engine.is_running()
    assert not is_live(pid)


@pytest.mark.docker
def test_engine_started_by_someone_else_on_the_socket_is_reused_and_stoppable(spare_engine: DockerEngine) -> None:
    state = spare_engine.state_dir
    argv = ["dockerd", "--host", f"unix://{state}/docker.sock", "--data-root", str(state / "data")]
    argv += ["--exec-root", str(state / "exec"), "--pidfile", str(state / "dockerd.pid"), "--bridge", "none"]
    argv += ["--iptables=false", "--ip6tables=false"]
    with (state / "foreign.log").open("wb") as log:
        foreign = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not spare_engine.is_running():
            assert foreign.poll() is None and time.monotonic() < deadline, (state / "foreign.log").read_text()
            time.sleep(0.2)

        assert spare_engine.ensure_running() == f"unix://{state}/docker.sock"
        assert not spare_engine.started_here
        spare_engine.stop()

        assert foreign.wait(timeout=30) == 0
    finally:
        if foreign.poll() is None:
            foreign.kill()
            foreign.wait()


def mounts_under(root: Path) -> list[str]:
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [point for point in points if point.startswith(str(root))]


@pytest.mark.docker
def test_stop_after_a_crashed_engine_stops_its_containerd_and_releases_its_mounts(spare_engine: DockerEngine) -> None:
    try:
        spare_engine.ensure_running()
    except EngineError as exc:
        unavailable(str(exc))
    containerd_pid = int((spare_engine.state_dir / "exec" / "containerd" / "containerd.pid").read_text())
    os.kill(int(spare_engine.pid_file.read_text()), signal.SIGKILL)
    assert mounts_under(spare_engine.state_dir)

    spare_engine.stop()

    assert not is_live(containerd_pid)
    assert mounts_under(spare_engine.state_dir) == []


@pytest.mark.docker
def test_failed_start_reports_dockerds_own_explanation(spare_engine: DockerEngine) -> None:
    spare_engine.state_dir.mkdir(parents=True, exist_ok=True)
    (spare_engine.state_dir / "data").write_text("a file where the data root should be")

    with pytest.raises(EngineError) as failure:
        spare_engine.ensure_running()

    assert "points to a file" in str(failure.value)
    assert not spare_engine.is_running()
