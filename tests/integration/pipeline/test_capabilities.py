"""What a host can serve, probed with real parts: the Chromium of this machine and a PATH without it, the real
bubblewrap, a Docker host that points nowhere, HTTP servers on this host standing in for a model endpoint
and a forge API (answering, refusing the credentials, not listening), and ``durafix worker`` itself refusing
to start, or printing ``--check``'s table, in a child process."""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from environments.sandbox import bwrap_problem
from infra.processes import free_port
from pipeline.config import DurafixConfig
from pipeline.steps import TaskQueue
from pipeline.worker import capabilities
from pipeline.worker.capabilities import Missing, QueueCheck, probe, refusal
from tests.conftest import require
from tests.support.chromium import chromium_path
from tests.support.served import QuietHandler, served

REPO_ROOT = Path(__file__).resolve().parents[3]


def config(tmp_path: Path, **settings: object) -> DurafixConfig:
    return DurafixConfig.model_validate({"state_dir": tmp_path, **settings})


@pytest.fixture
def no_chromium_path(tmp_path: Path) -> str:
    """A PATH with git (the other queues' probes run) and nothing else: no chromium."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    git = shutil.which("git")
    assert git is not None
    (bin_dir / "git").symlink_to(git)
    return str(bin_dir)


@pytest.fixture
def answering() -> Iterator[tuple[str, list[str | None]]]:
    """An HTTP server on this host answering 401 to the credential ``bad`` and 404 to anything else; the
    Authorization header of every request is recorded."""
    seen: list[str | None] = []

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            auth = self.headers.get("Authorization")
            seen.append(auth)
            self.answer(401 if auth is not None and auth.endswith(" bad") else 404)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with served(server):
        yield f"http://127.0.0.1:{server.server_address[1]}", seen


# ---- browser ------------------------------------------------------------------------------------------


def test_finds_this_machines_chromium_by_launching_it_as_the_runner_would(tmp_path: Path) -> None:
    chromium_path()
    (check,) = probe(config(tmp_path), [TaskQueue.BROWSER])
    assert check.ok, check.problem
    assert check.found[0].startswith("chromium ") and check.found[0].split()[1][0].isdigit()


def test_refuses_the_browser_queue_on_a_path_without_chromium(
    tmp_path: Path, no_chromium_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", no_chromium_path)
    (check,) = probe(config(tmp_path), [TaskQueue.BROWSER])
    assert (check.ok, check.status) == (False, "missing")
    assert "neither 'chromium-headless-shell' nor 'chromium' on PATH" in (check.problem or "")
    why = refusal([check])
    assert why is not None and "cannot serve the browser queue" in why and "apt-get install chromium" in why


# ---- environments -------------------------------------------------------------------------------------


def test_a_docker_host_pointing_nowhere_is_refused_with_the_reason(tmp_path: Path) -> None:
    host = f"tcp://127.0.0.1:{free_port()}"
    (check,) = probe(config(tmp_path, environment_provider="docker", docker_host=host), [TaskQueue.ENVIRONMENTS])
    assert check.status == "missing"
    assert f"the Docker engine at {host} does not answer" in (check.problem or "")
    assert "Connection refused" in (check.problem or "")
    assert "DURAFIX_DOCKER_HOST" in (check.problem or "")


def test_the_docker_provider_without_a_host_says_which_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    (check,) = probe(config(tmp_path, environment_provider="docker"), [TaskQueue.ENVIRONMENTS])
    assert not check.ok and "set DURAFIX_DOCKER_HOST" in (check.problem or "")


def test_the_local_provider_finds_a_working_bubblewrap(tmp_path: Path) -> None:
    require(bwrap_problem() is None, f"bubblewrap is unusable here: {bwrap_problem()}")
    (check,) = probe(config(tmp_path), [TaskQueue.ENVIRONMENTS])
    assert check.ok, check.problem
    assert check.found[0].startswith("git ") and check.found[1].startswith("bubblewrap ")


def test_the_local_provider_without_bubblewrap_is_refused_unless_running_unsandboxed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The local provider's bubblewrap is at a fixed path: this host's, moved to where nothing is.
    missing = tmp_path / "no-bwrap"
    monkeypatch.setattr("environments.sandbox.BWRAP", str(missing))
    (refused,) = probe(config(tmp_path), [TaskQueue.ENVIRONMENTS])
    assert refused.status == "missing" and f"{missing} is not installed" in (refused.problem or "")
    assert "install the Debian package bubblewrap, or set DURAFIX_UNSANDBOXED=1" in (refused.problem or "")
    (allowed,) = probe(config(tmp_path, unsandboxed=True), [TaskQueue.ENVIRONMENTS])
    assert allowed.ok and allowed.found[-1] == f"unsandboxed (DURAFIX_UNSANDBOXED=1; {missing} is not installed)"


# ---- model --------------------------------------------------------------------------------------------


def test_a_model_endpoint_needs_a_key_unless_it_is_on_this_host(tmp_path: Path) -> None:
    (check,) = probe(config(tmp_path, model_base_url="https://models.example/v1"), [TaskQueue.MODEL])
    assert check.status == "missing" and "set OPENAI_API_KEY" in (check.problem or "")


def test_a_local_model_endpoint_that_answers_is_found(tmp_path: Path, answering: tuple[str, list[str | None]]) -> None:
    url, seen = answering
    (check,) = probe(config(tmp_path, model_base_url=f"{url}/v1"), [TaskQueue.MODEL])
    assert check.ok, check.problem
    assert check.found[-1] == f"model endpoint {url}/v1" and seen == [None]


def test_a_refused_model_key_is_missing_and_an_endpoint_not_listening_is_unreachable(
    tmp_path: Path, answering: tuple[str, list[str | None]]
) -> None:
    url, seen = answering
    (refused,) = probe(config(tmp_path, model_base_url=url, model_api_key="bad"), [TaskQueue.MODEL])
    assert refused.status == "missing" and "refuses the key (HTTP 401)" in (refused.problem or "")
    assert seen == ["Bearer bad"]
    silent = f"http://127.0.0.1:{free_port()}/v1"
    (down,) = probe(config(tmp_path, model_base_url=silent), [TaskQueue.MODEL])
    assert down.status == "unreachable" and f"the model endpoint {silent} does not answer" in (down.problem or "")
    # It does not answer now: the worker starts and says so, it does not refuse.
    assert refusal([down]) is None
    assert capabilities.warnings([down]) == [f"the model queue: {down.problem}; its activities retry"]


# ---- forge --------------------------------------------------------------------------------------------


def test_the_forge_needs_credentials(tmp_path: Path) -> None:
    (check,) = probe(config(tmp_path), [TaskQueue.FORGE])
    assert check.status == "missing" and "DURAFIX_FORGE_TOKEN" in (check.problem or "")
    assert "DURAFIX_GITHUB_APP_ID" in (check.problem or "")


def test_a_forge_token_is_sent_and_a_refused_one_is_missing(
    tmp_path: Path, answering: tuple[str, list[str | None]]
) -> None:
    url, seen = answering
    (good,) = probe(config(tmp_path, forge_api_url=url, forge_token="t0k"), [TaskQueue.FORGE])
    assert good.ok and good.found[-1] == f"forge {url} (token)"
    (bad,) = probe(config(tmp_path, forge_api_url=url, forge_token="bad"), [TaskQueue.FORGE])
    assert bad.status == "missing" and "refuses the token" in (bad.problem or "")
    assert seen == ["token t0k", "token bad"]


def test_github_app_settings_serve_the_forge_once_their_key_is_readable(
    tmp_path: Path, answering: tuple[str, list[str | None]]
) -> None:
    url, _ = answering
    key = tmp_path / "app.pem"
    app = {"forge_api_url": url, "github_app_id": "12345", "github_app_private_key_file": str(key)}
    (absent,) = probe(config(tmp_path, **app), [TaskQueue.FORGE])
    assert absent.status == "missing" and f"{key} is not a readable file" in (absent.problem or "")
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    (present,) = probe(config(tmp_path, **app), [TaskQueue.FORGE])
    assert present.ok and present.found[-1] == f"forge {url} (app 12345)"


# ---- the table and the command -------------------------------------------------------------------------


def test_the_table_has_a_row_per_queue_asked_with_its_status() -> None:
    checks = [
        QueueCheck(TaskQueue.ORCHESTRATION, "Temporal"),
        QueueCheck(TaskQueue.BROWSER, "Chromium", problem="chromium is not installed"),
        QueueCheck(TaskQueue.MODEL, "a model endpoint", ["git 2"], problem="does not answer", lasting=False),
    ]
    lines = capabilities.table(checks).splitlines()
    assert lines[0].split() == ["queue", "needs", "status", "detail"]
    assert lines[1].split()[:3] == ["orchestration", "Temporal", "found"]
    assert lines[2].split()[:3] == ["browser", "Chromium", "missing"] and lines[2].endswith("chromium is not installed")
    assert "unreachable" in lines[3]
    served = [checks[0], QueueCheck(TaskQueue.BROWSER, "Chromium", ["chromium 156.0.8078.114"])]
    assert capabilities.advertisement(served) == "serves orchestration; browser (chromium 156.0.8078.114)"


def test_a_probe_shared_by_queues_runs_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def git(config: DurafixConfig) -> str:
        calls.append("git")
        raise Missing("git is not installed")

    monkeypatch.setattr(capabilities, "git", git)
    requirements = {q: capabilities.Requirement(r.needs, [git]) for q, r in capabilities.REQUIREMENTS.items()}
    monkeypatch.setattr(capabilities, "REQUIREMENTS", requirements)
    checks = probe(config(tmp_path), [TaskQueue.FORGE, TaskQueue.MODEL])
    assert calls == ["git"] and [c.problem for c in checks] == ["git is not installed"] * 2


def run_worker_command(tmp_path: Path, path: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DURAFIX_", "OPENAI_"))}
    env |= {"PATH": path, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "--state-dir", str(tmp_path / "state"), "worker", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_worker_refuses_the_browser_queue_without_chromium_before_supervising(
    tmp_path: Path, no_chromium_path: str
) -> None:
    # Supervised (the default): the parent checks, so no child is started and no Temporal is needed.
    result = run_worker_command(tmp_path, no_chromium_path, "--queues", "browser")
    assert result.returncode == 2, result.stderr
    assert "durafix: worker not started: cannot serve the browser queue" in result.stderr
    assert "chromium is not installed (neither 'chromium-headless-shell' nor 'chromium' on PATH)" in result.stderr
    assert "apt-get install chromium" in result.stderr
    assert "supervisor" not in result.stderr


def test_check_prints_the_table_and_fails_when_an_asked_queue_cannot_be_served(
    tmp_path: Path, no_chromium_path: str
) -> None:
    result = run_worker_command(tmp_path, no_chromium_path, "--check", "--queues", "orchestration,browser")
    assert result.returncode == 1, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert set(rows) == {"orchestration", "browser"}
    assert " found " in rows["orchestration"] and " missing " in rows["browser"]
    served = run_worker_command(tmp_path, no_chromium_path, "--check", "--queues", "orchestration")
    assert served.returncode == 0 and "orchestration" in served.stdout
