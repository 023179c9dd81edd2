"""A command or test reproduction (:mod:`environments.reproduction`) run by ``env.reproduce_in_sandbox``, and what
of it is stored: the whole :class:`~environments.command_repro.SandboxReproduction` as JSON (the reproduction's
log, what the report, the repair agent and verification read) and each run's sandbox output.

Everything stored here is what the repository's commands (or the report's) printed: it is redacted with the
worker's output redactor first, string by string, so a secret is found whatever JSON would have escaped in it.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from environments.command_repro import SandboxReproduction
from environments.redaction import Redactor
from evidence.interface import ArtifactKind, ArtifactRef, ArtifactStore
from pipeline.steps import ReproduceResult

REPRODUCTION_LOG = "reproduction.json"


def op_label(op_id: str) -> str:
    """The label an operation ID names its outputs with (``<wf>:reproduce-base:1`` -> ``reproduce-base``), as the
    browser's reproduction names its artifacts."""
    return op_id.rsplit(":", 2)[-2] if op_id.count(":") >= 2 else "run"


def redacted_json(found: SandboxReproduction, redactor: Redactor) -> bytes:
    """``found`` as indented JSON with every string in it redacted."""
    return json.dumps(_redacted(found.model_dump(mode="json"), redactor), indent=2, ensure_ascii=False).encode()


def _put_log(store: ArtifactStore, log: Path, name: str, run_id: str, revision: str, redactor: Redactor) -> ArtifactRef:
    with tempfile.TemporaryDirectory(prefix="durafix-redacted-") as tmp:
        clean = redactor.file(log, Path(tmp) / name) if redactor else log
        return store.put_file(
            clean, kind=ArtifactKind.LOG, run_id=run_id, name=name, revision=revision, media_type="text/plain"
        )


def _redacted(value: object, redactor: Redactor) -> object:
    if isinstance(value, str):
        return redactor.text(value) if redactor else value
    if isinstance(value, list):
        return [_redacted(v, redactor) for v in value]
    if isinstance(value, dict):
        return {k: _redacted(v, redactor) for k, v in value.items()}
    return value


def store_reproduction(
    store: ArtifactStore,
    found: SandboxReproduction,
    log_dir: Path,
    *,
    run_id: str,
    op_id: str,
    revision: str,
    redactor: Redactor,
) -> ReproduceResult:
    """Store ``found`` (``<label>-reproduction.json``) and each run's sandbox log in ``log_dir``
    (``<label>-reproduction-run-<n>.log``), redacted, tagged with ``revision``; the step's result, its
    ``log_ref`` the JSON."""
    label = op_label(op_id)
    logs: list[ArtifactRef] = []
    for n in range(1, len(found.runs) + 1):
        log = log_dir / f"reproduction-run-{n}.log"
        if log.is_file():
            logs.append(_put_log(store, log, f"{label}-{log.name}", run_id, revision, redactor))
    document = store.put_bytes(
        redacted_json(found, redactor),
        kind=ArtifactKind.LOG,
        run_id=run_id,
        name=f"{label}-{REPRODUCTION_LOG}",
        revision=revision,
        media_type="application/json",
    )
    return ReproduceResult(
        status=found.status,
        detail=redactor.text(found.detail) if redactor else found.detail,
        artifacts=[*logs, document],
        trace_refs=[],
        screenshot_refs=[],
        log_ref=document,
        runs=len(found.runs),
    )
