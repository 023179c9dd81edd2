"""End-to-end fixtures: the embedded stack (real Temporal dev server, GitHub emulator, scripted model server,
evidence server) started as real processes, workers and the webhook receiver as subprocesses.

Each test gets its own repository in the emulator, so runs never share forge state.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml
from github import Github
from temporalio.client import Client

from environments.files import path_key
from environments.processes import MARKER_VAR
from infra import processes, stack
from infra.cli.demo import OWNER, ensure_user, issue_text, maintainer_git_env, seed_repository
from infra.forge.testing import client as forge_client
from infra.processes import ServiceRecord
from pipeline import client as runs
from pipeline.config import DurafixConfig
from pipeline.ids import branch_for, workflow_id_for
from pipeline.services import Services
from pipeline.state import Outcome, RunState
from tests.conftest import require
from tests.support.chromium import chromium_path
from tests.support.gitrepo import write_files
from tests.support.proctree import environ_pids
from tests.support.waiting import wait_for as wait_for  # the stack's tests wait with it

REPO_ROOT = Path(__file__).resolve().parents[2]
FAULTY_WORKER = Path(__file__).resolve().parent / "workers" / "faulty.py"
MODEL_DIR = REPO_ROOT / "examples" / "cart" / "model"
NEVER_FIXABLE = "never-fixable"


def combined_model_script(dest: Path) -> Path:
    """Procedure drafting as scripted; revisions on review get the scripted revision; reports whose text says
    ``never-fixable`` get the bad fix; every other report gets the real fix."""
    revision = yaml.safe_load((MODEL_DIR / "revision.yaml").read_text())
    bad = yaml.safe_load((MODEL_DIR / "bad-fix.yaml").read_text())
    good = yaml.safe_load((MODEL_DIR / "fix.yaml").read_text())
    draft = yaml.safe_load((MODEL_DIR / "draft-procedure.yaml").read_text())
    conversations = [*draft["conversations"], *revision["conversations"]]
    for conv in bad["conversations"]:
        conv = dict(conv)
        conv["match"] = {**(conv.get("match") or {}), "user": NEVER_FIXABLE}
        conversations.append(conv)
    conversations.extend(good["conversations"])
    dest.write_text(yaml.safe_dump({"model": good.get("model", "durafix-scripted"), "conversations": conversations}))
    return dest


class OpenedRun(NamedTuple):
    """A report opened on a fresh repository, and the ID of the run that handles it."""

    client: Client
    repository: str
    issue: int
    workflow_id: str


@dataclass
class E2EStack:
    config: DurafixConfig
    admin_token: str
    reviewer_token: str
    receiver: ServiceRecord
    workers: list[ServiceRecord] = field(default_factory=list)

    @property
    def state_dir(self) -> Path:
        return self.config.state_dir

    def spawn_worker(
        self,
        *,
        kill_after: list[str] | None = None,
        kill_dir: Path | None = None,
        fault: str | None = None,
        extra_env: dict[str, str] | None = None,
        metrics_port: int | None = None,
    ) -> ServiceRecord:
        """A ``durafix worker`` process; with ``kill_after``, one that SIGKILLs itself right after the forge
        accepted the named adapter operation (once per operation, across processes). ``fault`` runs
        :mod:`tests.support.workers.faulty` with that fault in place of ``python -m pipeline``; ``kill_dir``
        is where kills (or holds) are noted. ``metrics_port``: the worker serves ``/metrics`` there (the
        record's ``url``). ``extra_env``: variables of its own (an OTLP endpoint, a log format). It keeps no warm spare
        (``--no-spare``): a test stack's worker lives one test, and a spare's start is a whole worker's CPU that
        only failover needs, which the failover tests start with their own launcher."""
        n = len(self.workers)
        env = {"PYTHONPATH": str(REPO_ROOT), **(extra_env or {})}
        if metrics_port is not None:
            env["DURAFIX_METRICS_PORT"] = str(metrics_port)
        if kill_after:
            env["DURAFIX_TEST_KILL_AFTER"] = ",".join(kill_after)
            fault = fault or "kill-after-forge-write"
        if fault is not None:
            assert kill_dir is not None
            env["DURAFIX_TEST_KILL_DIR"] = str(kill_dir)
        argv = [sys.executable, str(FAULTY_WORKER), fault] if fault is not None else [sys.executable, "-m", "pipeline"]
        rec = processes.spawn(
            f"worker-{n}",
            [*argv, "--state-dir", str(self.state_dir), "worker", "--no-spare"],
            log=self.state_dir / "logs" / f"test-worker-{n}.log",
            port=metrics_port or 0,
            url=f"http://127.0.0.1:{metrics_port}/metrics" if metrics_port else "",
            env=env,
        )
        self.workers.append(rec)
        return rec

    def stop_workers(self) -> None:
        for rec in self.workers:
            processes.stop(rec, grace_s=15)
        self.workers.clear()

    def new_repository(self) -> str:
        return seed_repository(
            self.config, self.admin_token, "reviewer", self.receiver.url, name=f"cart-{uuid.uuid4().hex[:8]}"
        )

    def push_files(self, repository: str, files: dict[str, str], message: str, *, branch: str = "main") -> str:
        """Commit ``files`` (path -> text) on top of ``branch`` as the repositories' owner and push it with git over
        HTTP; the new head."""
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp) / "work"
            env = maintainer_git_env(self.owner_token(), Path(tmp))
            url = f"{self.config.forge_git_base}/{repository}.git"

            def git(*args: str) -> str:
                return subprocess.run(
                    ["git", *args], cwd=work, env=env, check=True, capture_output=True, text=True
                ).stdout.strip()

            subprocess.run(
                ["git", "clone", "-q", "-b", branch, url, str(work)], env=env, check=True, capture_output=True
            )
            write_files(work, files)
            git("add", "-A")
            git("commit", "-q", "-m", message)
            git("push", "-q", "origin", f"HEAD:{branch}")
            return git("rev-parse", "HEAD")

    def open_report(
        self, repository: str, title: str | None = None, body: str | None = None, *, labelled: bool = True
    ) -> int:
        """The sample report (or ``title``/``body``), with the trigger label unless ``labelled`` is false (then
        the receiver ignores it)."""
        default_title, default_body = issue_text()
        labels = [self.config.trigger_label] if labelled else []
        issue = (
            self.github()
            .get_repo(repository)
            .create_issue(title=title or default_title, body=body or default_body, labels=labels)
        )
        assert [label.name for label in issue.labels] == labels
        return int(issue.number)

    async def open_run(self, title: str | None = None, body: str | None = None, *, labelled: bool = True) -> OpenedRun:
        """A Temporal client, a fresh repository and a report opened on it (see :meth:`open_report`)."""
        client = await runs.connect(self.config)
        repository = self.new_repository()
        issue = self.open_report(repository, title, body, labelled=labelled)
        return OpenedRun(client, repository, issue, workflow_id_for(repository, issue))

    def owner_token(self) -> str:
        """A token of the repositories' owner (it administers their hooks)."""
        return ensure_user(self.config, self.admin_token, OWNER)

    def github(self, token: str | None = None) -> Github:
        return forge_client(self.config.forge_api_url, token or self.config.forge_token)

    def approve_on_forge(self, repository: str, pr_number: int, head: str) -> None:
        """The reviewer approves ``head`` of the PR with a review on the forge, as a real reviewer does; the
        forge's webhook carries the approval to the run."""
        repo = self.github(self.reviewer_token).get_repo(repository)
        repo.get_pull(pr_number).create_review(commit=repo.get_commit(head), event="APPROVE", body="LGTM")

    def deliveries_log(self) -> str:
        return processes.log_tail(Path(self.receiver.log), 40)


@contextmanager
def running_e2e_stack(
    state: Path,
    *,
    warm: Callable[[DurafixConfig], None] | None = None,
    configure: Callable[[DurafixConfig], None] | None = None,
    receiver_ready_s: float = 120,
    **up: Any,
) -> Iterator[E2EStack]:
    """The embedded stack (``infra.stack.up(state, **up)``) with fast timeouts and a webhook receiver.

    ``warm`` runs once the stack is up (e.g. importing a cached base image); ``configure`` changes the saved
    config before the receiver starts. A stack that cannot start fails the test under CI with the reason
    (skips elsewhere); everything started is stopped at the end.
    """
    try:
        config = stack.up(state, quiet=True, **up)
        if warm is not None:
            warm(config)
    except Exception as err:
        stack.down(state, quiet=True)
        require(False, f"the embedded stack could not start: {err}")
        raise
    except BaseException:
        stack.down(state, quiet=True)
        raise
    config.fast_timeouts = True
    config.max_repair_attempts = 2
    # The CLI and evidence-digest tests approve as operators (`durafix approve`); every other approval is a
    # review on the forge, which the merge checks whatever this says (tests/security/test_reviews.py).
    config.operator_approval = True
    if configure is not None:
        configure(config)
    config.save()
    st = stack.read_stack(state)
    port = processes.free_port()
    receiver = processes.spawn(
        "receiver",
        [sys.executable, "-m", "pipeline", "--state-dir", str(state), "serve", "--port", str(port)],
        log=state / "logs" / "test-receiver.log",
        port=port,
        url=f"http://127.0.0.1:{port}/webhook",
    )
    e2e = E2EStack(config=config, admin_token=st.admin_token, reviewer_token=st.reviewer_token, receiver=receiver)
    try:
        # A loaded host imports the receiver slowly; the wait only bounds a receiver that never comes up.
        processes.wait_ready(receiver, lambda: processes.tcp_open("127.0.0.1", port), receiver_ready_s)
        yield e2e
    finally:
        e2e.stop_workers()
        processes.stop(receiver)
        stack.down(state, quiet=True)


@contextmanager
def scripted_stack(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    *,
    model_script: Callable[[Path], Path] = combined_model_script,
    worker: bool = False,
    **options: Any,
) -> Iterator[E2EStack]:
    """:func:`running_e2e_stack` (with ``options``) in a fresh directory ``name``, its model server answering
    from ``model_script(<directory>/model-script.yaml)``, and one worker started if ``worker``. Needs git and
    Chromium."""
    require(shutil.which("git") is not None, "git is not installed")
    chromium_path()
    state = tmp_path_factory.mktemp(name)
    with running_e2e_stack(state, model_script=model_script(state / "model-script.yaml"), **options) as stack:
        if worker:
            stack.spawn_worker()
        yield stack


@pytest.fixture(scope="session")
def e2e_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EStack]:
    with scripted_stack(tmp_path_factory, "durafix-e2e") as e2e:
        yield e2e


@pytest.fixture
def workers_stopped(e2e_stack: E2EStack) -> Iterator[E2EStack]:
    """The session's stack; every worker a test spawned on it is stopped at the test's end, also when it failed
    midway (a SIGKILLed one included)."""
    try:
        yield e2e_stack
    finally:
        e2e_stack.stop_workers()


@pytest.fixture
def stack_with_worker(workers_stopped: E2EStack) -> E2EStack:
    workers_stopped.spawn_worker()
    return workers_stopped


def owned_processes(run_id: str) -> list[int]:
    """PIDs of live processes carrying the run's ownership marker in their environment."""
    needle = f"{MARKER_VAR}={path_key(run_id)}/".encode()
    return environ_pids(lambda environ: needle in environ)


def kill(rec: ServiceRecord) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(rec.pid, signal.SIGKILL)


def footprint(stack: E2EStack, repository: str, workflow_id: str, issue: int) -> Any:
    return Services(stack.config).forge(repository).footprint(workflow_id, issue)


def one_of_each(stack: E2EStack, repository: str, workflow_id: str, issue: int, final: RunState | None = None) -> Any:
    """The run's footprint on the forge, asserted to be one ticket, one PR (the run's own, if ``final`` is
    given), the run's branch and one evidence comment."""
    fp = footprint(stack, repository, workflow_id, issue)
    assert len(fp.tickets) == 1, fp
    if final is None:
        assert len(fp.pull_requests) == 1, fp
    else:
        assert final.publish is not None and fp.pull_requests == [final.publish.pr_number], fp
    assert fp.branches == [branch_for(workflow_id)], fp
    assert len(fp.evidence_comments) == 1, fp
    return fp


def run_workspaces(stack: E2EStack, workflow_id: str) -> list[Path]:
    run_dir = stack.state_dir / "workspaces" / path_key(workflow_id)
    if not run_dir.exists():
        return []
    return [p for p in run_dir.iterdir() if p.is_dir()]


def assert_merged_once(e2e: E2EStack, repository: str, issue: int, wf: str, final: RunState) -> None:
    """The run merged its one PR; the forge holds one ticket, one branch, one PR, one evidence comment; nothing
    of the run is left on the machine."""
    assert final.outcome == Outcome.MERGED, final.outcome_detail
    fp = one_of_each(e2e, repository, wf, issue)
    repo = e2e.github().get_repo(repository)
    assert len(list(repo.get_pulls(state="all"))) == 1
    pr = repo.get_pull(fp.pull_requests[0])
    assert pr.merged and pr.merge_commit_sha == final.merged_sha
    assert repo.get_branch("main").commit.sha == final.merged_sha
    mine = [c for c in repo.get_issue(issue).get_comments() if "durafix:ticket" in c.body]
    assert len(mine) == 1 and "merged" in mine[0].body, [c.body for c in mine]
    assert owned_processes(wf) == []
    assert run_workspaces(e2e, wf) == []
