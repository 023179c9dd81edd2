"""The stepped repair attempt's run tools (environments queue): ``run_tests`` and ``run`` in the sandbox.

``env.agent_run`` carries out one such call (:mod:`repair.tools`) on a fresh workspace rebuilt from the
mirror at base + the patch so far, through the environment provider's sandbox, exactly as a verification
runs tests (:meth:`~environments.interface.EnvironmentProvider.run_checks`: the local provider's bubblewrap or
a Docker container; no network for the command, none of the worker's secrets). It appends the call's result
to the stored transcript and returns the new reference; the patch is not touched (what a command writes in
its workspace is not an edit the model made).

Replay policy ``report-interrupted``, enforced here with a durable started mark
(:mod:`pipeline.activities.started`): the mark is written just before the command starts; a try that finds
it (an earlier try, on any host, died while the command ran or before its result was recorded) does not run
the command again but records the result ``interrupted``, and the model is told so. A call refused before
anything ran (a command the recipe does not allow, a file that is not a test) is answered ``error: ...`` and
is safe to repeat. The command's output is stored by content, redacted; the model reads its redacted tail.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from temporalio import activity

from environments.checks import SetupError
from environments.interface import AppRecipe, RecoverySpec
from environments.workspace import WorkspaceManager
from evidence.interface import ArtifactKind, ArtifactRef, ArtifactStore
from pipeline import steps
from pipeline.activities.agent_calls import carried_call
from pipeline.activities.classify import classified
from pipeline.activities.environments import (
    SETUP_TIMEOUT_S,
    TEST_TIMEOUT_S,
    ProviderFor,
    output_redactor,
)
from pipeline.activities.heartbeat import Heartbeat
from pipeline.activities.started import had_started, mark_started
from pipeline.activities.workspace import open_spec, rebuild
from pipeline.steps import AgentRunInput, AgentRunResult
from repair.run_requests import MAX_OUTPUT_CHARS, RunRefused, RunRules, command_for, render_result
from repair.stepping import decode_transcript, encode_transcript, tool_message
from repair.tools import INTERRUPTED, parse_arguments
from repair.workspace_tools import ToolRefused
from reviews.git_credentials import GitCredentials

# A run tool answers within this, however long the recipe lets its tests take in a verification: the model
# waits for it, and a run that hangs should come back as a finding, not stall the attempt.
AGENT_RUN_TIMEOUT_S = min(TEST_TIMEOUT_S, 300.0)


def run_rules(recipe: AppRecipe) -> RunRules:
    return RunRules(
        test=recipe.test,
        test_subset=recipe.test_subset,
        test_file_globs=tuple(recipe.test_files),
        agent_commands=tuple(recipe.agent_commands),
    )


class AgentRunActivities:
    def __init__(
        self, store: ArtifactStore, workspaces: WorkspaceManager, provider_for: ProviderFor, git_token: GitCredentials
    ) -> None:
        self.store = store
        self.workspaces = workspaces
        self.provider_for = provider_for
        self.git_token = git_token

    def all(self) -> Sequence[Callable[..., object]]:
        return [self.agent_run]

    @activity.defn(name=steps.AGENT_RUN.name)
    def agent_run(self, inp: AgentRunInput) -> AgentRunResult:
        """One ``run_tests``/``run`` call; see the module docstring for what a retry does."""
        spec = open_spec(self.store, inp.spec_ref, inp.run_id, f"to run {inp.call.name} for {inp.op_id}")
        messages = decode_transcript(self.store.read_bytes(inp.transcript_ref))
        with classified():
            call = carried_call(messages, inp.call)
        output_ref: ArtifactRef | None = None
        interrupted = refused = False
        try:
            command = command_for(call.name, parse_arguments(call.name, call.arguments), run_rules(spec.recipe))
        except (ToolRefused, RunRefused) as e:
            content, refused = f"error: {e}", True
        else:
            if had_started(self.store, inp.run_id, inp.op_id):
                content, interrupted = INTERRUPTED, True
            else:
                content, output_ref = self._run(inp, spec, command)
        return AgentRunResult(
            transcript_ref=self.store.put_bytes(
                encode_transcript([*messages, tool_message(inp.call.id, content)]),
                kind=ArtifactKind.OTHER,
                run_id=inp.run_id,
                name=f"attempt-{inp.attempt}-run-{inp.turn}.transcript.json",
                media_type="application/json",
            ),
            output_ref=output_ref,
            interrupted=interrupted,
            refused=refused,
        )

    def _run(self, inp: AgentRunInput, spec: RecoverySpec, command: str) -> tuple[str, ArtifactRef]:
        """Rebuild base + patch, mark the call started, run ``command`` after the recipe's setup; the result
        text and the stored output."""
        patch = self.store.read_bytes(inp.patch_ref).decode() if inp.patch_ref is not None else None
        redactor = output_redactor(spec.recipe.secrets, self.git_token)
        name = f"attempt-{inp.attempt}-turn-{inp.turn}-{inp.call.name}.log"
        with Heartbeat(f"{inp.call.name} (attempt {inp.attempt}, turn {inp.turn}): {command}") as beat, classified():
            ws = rebuild(
                self.workspaces, self.git_token, inp.run_id, inp.op_id, spec.clone_url, spec.base_revision, patch
            )
            try:
                with tempfile.TemporaryDirectory(prefix="durafix-agent-run-") as tmp:
                    log = Path(tmp) / name
                    mark_started(self.store, inp.run_id, inp.op_id)
                    try:
                        result = self.provider_for(None).run_checks(
                            spec,
                            str(ws.path),
                            run_id=inp.run_id,
                            op_id=inp.op_id,
                            log_path=log,
                            setup_timeout_s=SETUP_TIMEOUT_S,
                            test_timeout_s=AGENT_RUN_TIMEOUT_S,
                            progress=beat.set,
                            command=command,
                        )
                    except SetupError as err:
                        said = str(err).splitlines()[0] if str(err) else "setup failed"
                        content = f"error: the recipe's setup failed before the command could run: {said}"
                        result = None
                        if not log.exists():
                            log.write_text(str(err))
                    clean = redactor.file(log, Path(tmp) / "redacted.log") if redactor else log
                    output_ref = self.store.put_file(
                        clean,
                        kind=ArtifactKind.TEST_OUTPUT,
                        run_id=inp.run_id,
                        name=name,
                        revision=spec.base_revision,
                        media_type="text/plain",
                    )
                    if result is not None:
                        content = render_result(
                            command,
                            exit_code=result.exit_code,
                            timed_out=result.timed_out,
                            duration_s=result.duration_s,
                            output=_tail(clean),
                            total_bytes=clean.stat().st_size,
                            log_name=name,
                        )
                    else:
                        content = redactor.text(content)
            finally:
                self.workspaces.remove(ws)
        return content, output_ref


def _tail(path: Path, limit: int = 4 * MAX_OUTPUT_CHARS) -> str:
    """The last ``limit`` bytes of ``path`` as text (a character cut in two is replaced)."""
    with path.open("rb") as f:
        size = f.seek(0, 2)
        f.seek(max(0, size - limit))
        return f.read().decode("utf-8", errors="replace")
