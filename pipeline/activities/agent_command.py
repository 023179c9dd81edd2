"""``model.agent_command``: one repair attempt by an external agent CLI (``engine: command``), model queue.

The activity rebuilds a scratch workspace from the mirror at the base revision, starts a model proxy on the
worker's loopback (:mod:`repair.model_proxy`: the real key stays here, the CLI gets a key minted for this
try, and every answer's tokens are counted), and runs the CLI (:mod:`repair.agent_command`) in the sandbox:
bubblewrap without a network, the workspace its only writable tree besides its own scratch directory, and one
port inside forwarded to the proxy (:mod:`environments.endpoint_forwarder`). Its environment is the contract's
and nothing of the worker's (no forge token, no evidence keys, not the model key). While it runs, the
activity heartbeats the requests and tokens so far; it kills the CLI's process group when the try is
cancelled, when its deadline passes, or when the proxy refuses a request for the budget. When the CLI exits,
the workspace's diff against the base is the proposal, judged against the mirror by the operator's patch
policy (:func:`pipeline.activities.agent.accepted_patch`), exactly as the built-in engine's.

What the CLI printed (its own output and whatever the commands it ran printed: the repository's code among
them) is stored as evidence, redacted (the recipe's secrets, the worker's credentials, the model key and the
attempt's proxy key), and named in a failure, never quoted: it reaches no prompt, no ticket, no history.

Retries and a lost worker: the CLI's own state (its conversation) lives in its process and is not recorded,
so a try never continues another one. A retry (the worker was SIGKILLed: the forwarder and the sandbox die
with it, the heartbeat times out) rebuilds the workspace at the base revision again (the last recorded
workspace of the attempt) and re-runs the CLI from the start, with the budget the earlier tries left: their
tokens up to their last heartbeat ride in its details (:mod:`pipeline.activities.spend`). Not idempotent at
the model, as no model call is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import CancelledError

from environments import endpoint_forwarder
from environments.interface import RecoverySpec
from environments.redaction import Redactor, redactor_for
from environments.sandbox import Sandbox
from environments.workspace import WorkspaceManager
from evidence.interface import ArtifactKind, ArtifactRef, ArtifactStore
from pipeline import steps
from pipeline.activities.agent import accepted_patch, attempt_request, proposal_result
from pipeline.activities.classify import classified
from pipeline.activities.environments import put_redacted_output
from pipeline.activities.heartbeat import Heartbeat
from pipeline.activities.spend import Spend, budgeted, failing
from pipeline.activities.workspace import PatchingActivities, open_spec, rebuild
from pipeline.failures import FailureClass
from pipeline.steps import AgentCommandInput, ProposalResult
from repair.agent_command import AgentCommand
from repair.interface import RepairRequest
from repair.model_proxy import ModelProxy
from repair.patch import workspace_patch
from repair.patch_policy import PatchPolicy
from reviews.git_credentials import GitCredentials

# The port the CLI finds the model proxy on inside its sandbox (its own network namespace: nothing else there).
INNER_PORT = 8480
# Kept between the CLI's deadline and the step's start-to-close timeout, for the patch to be taken and judged.
_MARGIN_S = 30.0


@dataclasses.dataclass(frozen=True)
class ModelEndpoint:
    """The real endpoint the proxy forwards to (only the worker holds its key)."""

    base_url: str
    api_key: str
    model: str


@dataclasses.dataclass
class _Ran:
    code: int | None
    log: Path
    key: str
    spent: Spend
    why_stopped: str = ""


class CommandActivities(PatchingActivities):
    def __init__(
        self,
        store: ArtifactStore,
        workspaces: WorkspaceManager,
        agent: Callable[[], AgentCommand],
        endpoint: ModelEndpoint,
        sandbox: Callable[[], Sandbox],
        git_token: GitCredentials,
        *,
        deadline_s: float = 1200.0,
        patch_policies: Mapping[str, PatchPolicy] | None = None,
    ) -> None:
        """``agent`` and ``sandbox`` are made on first use (installing an agent may take a while, and a host
        that never runs one needs no bubblewrap)."""
        super().__init__(store, workspaces, git_token, patch_policies)
        self.agent = agent
        self.endpoint = endpoint
        self.sandbox = sandbox
        self.deadline_s = deadline_s

    def all(self) -> Sequence[Callable[..., object]]:
        return [self.agent_command]

    @activity.defn(name=steps.AGENT_COMMAND.name)
    def agent_command(self, inp: AgentCommandInput) -> ProposalResult:
        """Run the agent CLI once on the base revision and judge its diff (see the module docstring)."""
        spec = open_spec(self.store, inp.spec_ref, inp.run_id, f"to rebuild a workspace for {inp.op_id}")
        earlier, beat = budgeted(f"starting the agent CLI (attempt {inp.attempt})", inp.token_budget, "attempt")
        with beat, classified():
            agent = self.agent()
            sandbox = self.sandbox()
            ws = rebuild(self.workspaces, self.git_token, inp.run_id, inp.op_id, spec.clone_url, spec.base_revision)
        agent_dir = ws.path.parent / f"{ws.path.name}.agent"
        try:
            shutil.rmtree(agent_dir, ignore_errors=True)
            agent_dir.mkdir(parents=True)
            request = attempt_request(inp, ws.path, earlier)
            # A Heartbeat's helper thread runs once; the one that beat during the rebuild has stopped.
            beat = Heartbeat(f"starting {agent.name} (attempt {inp.attempt})", carry=beat.carry)
            with beat:
                ran = self._run(agent, sandbox, request, ws.path, agent_dir, earlier, beat)
                log_name = f"attempt-{inp.attempt}-{agent.name}.log"
                log_ref = self._put_log(spec, inp.run_id, ran, log_name)
                named = {"log_ref": log_ref.model_dump(mode="json")}
                # Read beneath the agent's directory with no link followed (repair.agent_command), then redacted:
                # the summary becomes the commit message and the PR body.
                summary = self._redactor(spec, ran).text(agent.summary(agent_dir))
                if ran.why_stopped == "budget":
                    spent_all = FailureClass.BUDGET.error(
                        f"model budget: the agent CLI spent {ran.spent.total} of {inp.token_budget} tokens"
                    )
                    raise failing(spent_all, ran.spent, beat, named)
                ended = f"{agent.name} {ran.why_stopped}" if ran.why_stopped else f"{agent.name} exited {ran.code}"
                if ran.why_stopped or ran.code != 0:
                    stopped = FailureClass.NO_PATCH.error(f"{ended}; its output is stored as {log_name}")
                    raise failing(stopped, ran.spent, beat, named)
                patch, _ = workspace_patch(ws.path, base=spec.base_revision)
                if not patch:
                    unchanged = FailureClass.NO_PATCH.error(
                        f"{agent.name} finished without changing anything: {summary}"
                    )
                    raise failing(unchanged, ran.spent, beat, named)
                check = self.judge_patch(spec, patch)
                patch_ref = accepted_patch(
                    self.store, check, patch, inp.run_id, inp.attempt, spec.base_revision, ran.spent, beat, named
                )
        finally:
            self.workspaces.remove(ws)
            shutil.rmtree(agent_dir, ignore_errors=True)
            (agent_dir.parent / f"{agent_dir.name}.log").unlink(missing_ok=True)
        return proposal_result(patch_ref, summary, check.files, ran.spent, self.endpoint.model, log_ref)

    def _redactor(self, spec: RecoverySpec, ran: _Ran) -> Redactor:
        """Every secret known here: the recipe's, the forge tokens, the model key and the try's proxy key."""
        return redactor_for(
            spec.recipe.secrets,
            [
                *[("DURAFIX_FORGE_TOKEN", token) for token in self.git_token.known_tokens()],
                ("OPENAI_API_KEY", self.endpoint.api_key),
                ("DURAFIX_AGENT_KEY", ran.key),
            ],
        )

    def _put_log(self, spec: RecoverySpec, run_id: str, ran: _Ran, name: str) -> ArtifactRef:
        """The CLI's output stored by content, every secret known here redacted first (see the module)."""
        redactor = self._redactor(spec, ran)
        return put_redacted_output(self.store, ran.log, ArtifactKind.LOG, run_id, name, spec.base_revision, redactor)

    def _run(
        self,
        agent: AgentCommand,
        sandbox: Sandbox,
        request: RepairRequest,
        workspace: Path,
        agent_dir: Path,
        earlier: Spend,
        beat: Heartbeat,
    ) -> _Ran:
        """The CLI from start to exit (or to its kill), with the proxy serving it; the process group is killed
        on every way out, cancellation included."""
        e = self.endpoint
        budget = request.token_budget
        with ModelProxy(e.base_url, e.api_key, e.model, token_budget=budget, op_id=request.op_id) as proxy:
            port = INNER_PORT if sandbox.sandboxed else proxy.port
            inv = agent.invocation(
                request,
                # The path the CLI sees its working directory at (the sandbox's fixed one).
                workspace=sandbox.inside(workspace),
                agent_dir=agent_dir,
                base_url=f"http://127.0.0.1:{port}/v1",
                api_key=proxy.key,
                model=e.model,
            )
            boxed = dataclasses.replace(sandbox, read_only=(*sandbox.read_only, *inv.read_only))
            argv = boxed.wrap(inv.argv, workspace=workspace, writable=[agent_dir])
            if sandbox.sandboxed:
                # Isolated, by file, from a directory of the worker's: never importing the workspace's modules.
                argv = [*endpoint_forwarder.launcher(INNER_PORT, proxy.port), "--", *argv]
            log_path = agent_dir.parent / f"{agent_dir.name}.log"
            deadline = time.monotonic() + self._deadline()
            why = ""
            with log_path.open("wb") as log:
                proc = subprocess.Popen(
                    argv,
                    # Sandboxed, bwrap's --chdir puts the CLI in the workspace; the host process never starts there.
                    cwd=endpoint_forwarder.HOST_CWD if sandbox.sandboxed else workspace,
                    env=inv.env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                try:
                    beat.set(f"{agent.name} running (attempt {request.attempt})")
                    while True:
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            proc.wait(timeout=1.0)
                            break
                        spent = earlier.plus(proxy.prompt_tokens, proxy.completion_tokens)
                        if spent.model_dump() != beat.carry["spent"]:
                            # Beaten here too, not only by the helper thread: a lost worker's retry starts from
                            # the spend of the last beat, so a new count goes out as soon as it is known.
                            beat.carry["spent"] = spent.model_dump()
                            beat.detail = (
                                f"{agent.name} running: {proxy.requests} model request(s), {spent.total} tokens"
                            )
                            beat.beat()
                        if activity.is_cancelled():
                            raise CancelledError("the agent CLI's attempt was cancelled")
                        if proxy.exhausted.is_set():
                            why = "budget"
                            break
                        if time.monotonic() > deadline:
                            why = f"ran past its deadline of {self._deadline():.0f} s and was killed"
                            break
                finally:
                    _kill_group(proc)
            spent = earlier.plus(proxy.prompt_tokens, proxy.completion_tokens)
            beat.carry["spent"] = spent.model_dump()
            return _Ran(code=proc.returncode, log=log_path, key=proxy.key, spent=spent, why_stopped=why)

    def _deadline(self) -> float:
        """The operator's deadline, kept below the step's own start-to-close timeout."""
        info = activity.info()
        step_limit = info.start_to_close_timeout.total_seconds() if info.start_to_close_timeout else None
        if step_limit is None:
            return self.deadline_s
        return max(1.0, min(self.deadline_s, step_limit - _MARGIN_S))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the CLI's whole process group (the forwarder and bwrap; bwrap's PID namespace takes the rest)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
