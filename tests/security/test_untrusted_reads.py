"""Files sandboxed code could have written are read with no link followed, never unbounded, never from a FIFO.

Each file the worker reads back from a workspace or an agent's directory (an agent's summary, mini-swe-agent's
trajectory, the recipe's test report) is attacked the three ways the boundary names: a symlink to the worker's
own secrets (the state directory's ``config.json``, ``/proc/self/environ``), a FIFO (a reader would block
forever), and a 10 GB sparse file (a reader would run out of memory). Nothing of a target is read, the step goes
on with a clear reason, and neither the kernel's ``openat2`` nor the component-wise fallback follows a link.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from environments import untrusted_files
from environments.test_results import ReportError, read_workspace_report
from environments.untrusted_files import UntrustedFileError, read_beneath, unlink_beneath, write_beneath
from repair.agent_command import SUMMARY_FILE, ShellAgent
from repair.mini_swe_agent import TRAJECTORY, MiniSweAgent
from repair.workspace_tools import ToolRefused, WorkspaceTools
from tests.integration.repair.test_command_engine import activity_env, attempt_input
from tests.integration.repair.test_command_engine import engine as command_engine
from tests.support.gitrepo import fixed_cart_source, make_repo
from tests.support.modelserver import Serve, serve
from tests.support.repair import CART_SCRIPTS

__all__ = ["serve"]

SECRET = "SECRET-FROM-THE-STATE-DIRECTORY"
ENV_SECRET = "SECRET-FROM-THE-WORKERS-ENVIRONMENT"
TEN_GB = 10 * 1024**3


@pytest.fixture(params=["openat2", "component-wise"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a path is resolved: the kernel's openat2, and the per-component O_NOFOLLOW fallback."""
    if request.param == "component-wise":
        monkeypatch.setattr(untrusted_files, "_openat2_missing", True)
    return str(request.param)


@pytest.fixture
def state_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state directory's ``config.json`` holding a secret, and the same kind of secret in this process's
    environment (so ``/proc/self/environ`` holds it)."""
    monkeypatch.setenv("DURAFIX_FORGE_TOKEN", ENV_SECRET)
    config = tmp_path / "state" / "config.json"
    config.parent.mkdir()
    config.write_text(f'{{"forge_token": "{SECRET}"}}')
    return config


Plant = Callable[[Path], None]


def _plants(config: Path) -> dict[str, Plant]:
    return {
        "link-to-config": lambda p: p.symlink_to(config),
        "link-to-environ": lambda p: p.symlink_to("/proc/self/environ"),
        "link-through-parent": lambda p: None,  # set up by the test: the file's directory is a link
        "fifo": lambda p: os.mkfifo(p),
        "sparse-10GB": lambda p: os.truncate(_touch(p), TEN_GB),
    }


def _touch(path: Path) -> Path:
    path.write_bytes(b"")
    return path


KINDS = ["link-to-config", "link-to-environ", "fifo", "sparse-10GB"]


def _finishes(fn: Callable[[], object], timeout_s: float = 60.0) -> object:
    """``fn()``'s answer; fails the test (instead of hanging it) when it blocks, as a FIFO read would."""
    box: list[object] = []
    thread = threading.Thread(target=lambda: box.append(_catching(fn)), daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), "the read blocked (a FIFO was opened as a file)"
    return box[0]


def _planted(tmp_path: Path, state_config: Path, kind: str, name: str) -> Path:
    """An agent's directory whose file ``name`` is planted as ``kind`` (see :func:`_plants`)."""
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    _plants(state_config)[kind](agent_dir / name)
    return agent_dir


def _catching(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as exc:  # the caller inspects what was raised
        return exc


@pytest.mark.parametrize("kind", KINDS)
def test_an_agents_summary_that_is_a_link_fifo_or_huge_is_not_read(
    tmp_path: Path, state_config: Path, resolver: str, kind: str
) -> None:
    agent_dir = _planted(tmp_path, state_config, kind, SUMMARY_FILE)
    said = _finishes(lambda: ShellAgent("true").summary(agent_dir))
    assert isinstance(said, str)
    assert SECRET not in said and ENV_SECRET not in said
    assert said == f"command finished without writing {SUMMARY_FILE} (or it was refused)"


@pytest.mark.parametrize("kind", KINDS)
def test_a_trajectory_that_is_a_link_fifo_or_huge_is_not_read(
    tmp_path: Path, state_config: Path, resolver: str, kind: str
) -> None:
    agent_dir = _planted(tmp_path, state_config, kind, TRAJECTORY)
    said = _finishes(lambda: MiniSweAgent(tmp_path / "venv").summary(agent_dir))
    assert isinstance(said, str) and SECRET not in said and ENV_SECRET not in said
    assert said.startswith("mini-swe-agent finished without writing its trajectory")


def test_a_real_trajectory_is_still_read(tmp_path: Path, resolver: str) -> None:
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    (agent_dir / TRAJECTORY).write_text('{"info": {"submission": "fixed the total", "exit_status": "Submitted"}}')
    assert MiniSweAgent(tmp_path / "venv").summary(agent_dir) == "fixed the total"


@pytest.mark.parametrize("kind", [*KINDS, "link-through-parent"])
def test_a_test_report_that_is_a_link_fifo_or_huge_is_refused_with_a_reason(
    tmp_path: Path, state_config: Path, resolver: str, kind: str
) -> None:
    ws = tmp_path / "ws"
    (ws / "reports").mkdir(parents=True)
    report = "reports/junit.xml"
    if kind == "link-through-parent":
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "junit.xml").write_text('<testsuite><testcase name="forged"/></testsuite>')
        (ws / "reports").rmdir()
        (ws / "reports").symlink_to(outside)
    else:
        _plants(state_config)[kind](ws / report)
    raised = _finishes(lambda: read_workspace_report(ws, report))
    assert isinstance(raised, ReportError), raised
    assert SECRET not in str(raised) and ENV_SECRET not in str(raised)
    assert any(word in str(raised) for word in ("link", "not a regular file", "limit")), raised


def test_reading_stops_at_the_cap_even_for_a_file_that_says_it_is_small(tmp_path: Path, resolver: str) -> None:
    (tmp_path / "log").write_bytes(b"x" * 5000)
    with pytest.raises(UntrustedFileError, match="limit"):
        read_beneath(tmp_path, "log", max_bytes=4096)
    assert read_beneath(tmp_path, "log", max_bytes=4096, truncate=True) == b"x" * 4096


@pytest.mark.parametrize("rel", ["../etc/passwd", "/etc/passwd", "a/../../x", ""])
def test_paths_leading_outside_are_refused(tmp_path: Path, rel: str) -> None:
    with pytest.raises(UntrustedFileError):
        read_beneath(tmp_path, rel)


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Path]:
    target = tmp_path / "outside"
    target.mkdir()
    (target / "victim.txt").write_text("the worker's file\n")
    yield target
    assert (target / "victim.txt").read_text() == "the worker's file\n", "a write went through a link"


def test_a_write_or_removal_never_goes_through_a_planted_link(tmp_path: Path, outside: Path, resolver: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "dir").symlink_to(outside)
    (ws / "file.txt").symlink_to(outside / "victim.txt")
    for rel in ("dir/victim.txt", "file.txt"):
        with pytest.raises(UntrustedFileError, match="link"):
            write_beneath(ws, rel, b"overwritten")
    unlink_beneath(ws, "dir/victim.txt")  # not followed: nothing removed outside
    unlink_beneath(ws, "file.txt")  # the link itself goes, never its target
    assert not (ws / "file.txt").is_symlink()


def test_the_agents_file_tools_refuse_a_link_swapped_in_after_the_check(
    tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app keeps running while the model edits, so a path checked by ``resolve`` may be swapped for a link
    before it is used: the write and the read still follow nothing."""
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "app.py").write_text("print('hi')\n")
    tools = WorkspaceTools(ws)
    checked = tools.resolve

    def swapped(path: str) -> Path:
        target = checked(path)
        (ws / "src" / "app.py").unlink()
        (ws / "src" / "app.py").symlink_to(outside / "victim.txt")
        return target

    monkeypatch.setattr(tools, "resolve", swapped)
    with pytest.raises(ToolRefused, match="link"):
        tools.write_file("src/app.py", "overwritten\n")
    with pytest.raises(ToolRefused):
        tools.read_file("src/app.py")


def test_an_agents_summary_is_redacted_before_it_becomes_the_proposal(tmp_path: Path, serve: Serve) -> None:
    """The summary is the commit message and the PR body: the try's own proxy key (all the CLI holds) and the
    recipe's secrets are redacted from it, as from the CLI's log."""
    repo = make_repo(tmp_path / "repo")
    server = serve(CART_SCRIPTS / "mini-swe-agent-fix.yaml")
    fix = tmp_path / "fixed_cart.py"
    fix.write_text(fixed_cart_source(repo))
    agent = ShellAgent(
        f'cp {fix} cart.py; echo "fixed; my key is $OPENAI_API_KEY" > "$DURAFIX_SUMMARY_FILE"', read_only=(fix,)
    )
    acts = command_engine(tmp_path, server, agent)

    proposal = activity_env().run(acts.agent_command, attempt_input(acts, repo))

    assert proposal.files_changed == ["cart.py"]
    assert proposal.summary == "fixed; my key is [redacted DURAFIX_AGENT_KEY]"
