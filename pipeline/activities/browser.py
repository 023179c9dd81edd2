"""The browser queue's activities.

- ``browser.prepare_procedure``: parse the report's ``durafix-repro`` block (any kind:
  :mod:`environments.reproduction`) and store it by content (idempotent: the same procedure always gives the same
  reference; a browser procedure's stored bytes are what they were before kinds existed), answering its kind.
- ``browser.reproduce``: re-checks that the environment answers HTTP (the environments' own probe, which
  never goes through a proxy) before running, never trusting the recorded handle: an app killed behind our
  back is reported as ``EnvironmentGone`` so the workflow provisions anew. Runs the procedure in a fresh
  browser context, heartbeats per step and while a step waits (so cancellation reaches it within the
  heartbeat interval; the run's context is closed before the activity ends cancelled), and stores traces,
  screenshots (the element crop of every check among them), videos (when the worker records them) and the log. Only
  complete, hash-verified artifacts are referenced: a worker killed mid-run leaves nothing referenced, and
  the retry starts over. A browser crash is an ``Infrastructure`` failure, retried, never reported as "not
  reproduced". The page may reach the app's origin and the recipe's ``browser_origins`` (read from the
  run's stored spec); the requests blocked beyond them are in the stored log, which the report lists.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from temporalio import activity

from browser.procedure import Procedure, ProcedureError
from browser.runner import BrowserRunner
from environments.readiness import answers
from environments.reproduction import describe, extract_reproduction, kind_of, needs_app, stored_form
from environments.spec import spec_from_json
from evidence.interface import ArtifactKind, ArtifactRef, ArtifactStore
from pipeline import steps
from pipeline.activities.classify import classified
from pipeline.activities.heartbeat import Heartbeat
from pipeline.failures import FailureClass
from pipeline.steps import PrepareProcedureInput, ProcedureResult, ReproduceInput, ReproduceResult


class BrowserActivities:
    def __init__(self, store: ArtifactStore, browser: Callable[[], BrowserRunner]) -> None:
        """``browser``: the worker's runner, made on first use (a host that never reproduces never launches
        Chromium)."""
        self.store = store
        self.browser = browser

    def all(self) -> Sequence[Callable[..., object]]:
        return [self.prepare_procedure, self.reproduce]

    @activity.defn(name=steps.PREPARE_PROCEDURE.name)
    def prepare_procedure(self, inp: PrepareProcedureInput) -> ProcedureResult:
        try:
            procedure = extract_reproduction(inp.report_body)
        except ProcedureError as err:
            return ProcedureResult(procedure_ref=None, error=f"invalid durafix-repro block: {err}")
        if procedure is None:
            return ProcedureResult(procedure_ref=None, error="the report has no ```durafix-repro block", missing=True)
        ref = self.store.put_bytes(
            stored_form(procedure),
            kind=ArtifactKind.PROCEDURE,
            run_id=inp.run_id,
            name="procedure.json",
            media_type="application/json",
        )
        return ProcedureResult(
            procedure_ref=ref, kind=kind_of(procedure), app=needs_app(procedure), described=describe(procedure)
        )

    @activity.defn(name=steps.REPRODUCE.name)
    def reproduce(self, inp: ReproduceInput) -> ReproduceResult:
        procedure = Procedure.model_validate_json(self.store.read_bytes(inp.procedure_ref))
        origins: list[str] = []
        if inp.spec_ref is not None:
            origins = spec_from_json(self.store.read_bytes(inp.spec_ref)).recipe.browser_origins
        env = inp.environment
        down = answers(env.base_url, inp.readiness_path)
        if down is not None:
            raise FailureClass.ENVIRONMENT_GONE.error(f"{env.env_id} does not answer at {env.base_url}: {down}")

        with tempfile.TemporaryDirectory(prefix="durafix-repro-") as tmp:
            # Beats go on during a step too (a ``wait_for`` may take its whole timeout): heartbeating is how a
            # sync activity learns it was cancelled, and the cancellation is raised in this thread, which the
            # runner answers by closing the run's browser context before it re-raises.
            with classified(), Heartbeat("opening the browser") as beat:

                def on_step(index: int, description: str) -> None:
                    beat.set(f"step {index}: {description}")

                result = self.browser().run(
                    procedure, env.base_url, Path(tmp), on_step=on_step, allowed_origins=origins
                )
            down = answers(env.base_url, inp.readiness_path)
            if down is not None:
                raise FailureClass.ENVIRONMENT_GONE.error(f"{env.env_id} died during the reproduction: {down}")
            traces = [self._put(p, ArtifactKind.TRACE, inp, "application/zip") for p in result.trace_paths]
            shots = [self._put(p, ArtifactKind.SCREENSHOT, inp, "image/png") for p in result.screenshot_paths]
            videos = [self._put(p, ArtifactKind.VIDEO, inp, "video/webm") for p in result.video_paths]
            log = self._put(result.log_path, ArtifactKind.LOG, inp, "application/json")
        return ReproduceResult(
            status=result.status,
            detail=result.detail,
            artifacts=[*traces, *shots, *videos, log],
            trace_refs=traces,
            screenshot_refs=shots,
            video_refs=videos,
            log_ref=log,
            runs=len(result.runs),
        )

    def _put(self, path: Path, kind: ArtifactKind, inp: ReproduceInput, media_type: str) -> ArtifactRef:
        label = inp.op_id.rsplit(":", 2)[-2] if inp.op_id.count(":") >= 2 else "run"
        return self.store.put_file(
            path,
            kind=kind,
            run_id=inp.run_id,
            name=f"{label}-{path.name}",
            revision=inp.revision,
            media_type=media_type,
        )
