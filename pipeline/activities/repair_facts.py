"""The :class:`~repair.context.RepairContext` of a stepped attempt's first turn, read from stored facts.

The workflow passes references and facts it holds (``AgentTurnInput``): the base reproduction (its stored
procedure and ``log.json``; a command or test reproduction's YAML and its stored record), the spec (the
recipe's test command and secrets), the baseline's summary and the earlier attempts. Everything is read by
content from the evidence store, so a retried first turn builds the same context. Redaction is the one the
environments apply to stored command output (:func:`pipeline.activities.environments.output_redactor`: the
recipe's secrets, the credentials known on this worker, the forge token it holds).
"""

from __future__ import annotations

import json

from pydantic import ValidationError

from browser.procedure import Procedure
from environments.reproduction import kind_of, load_reproduction, needs_app, to_yaml
from environments.spec import spec_from_json
from evidence.interface import ArtifactMissingError, ArtifactRef, ArtifactStore
from evidence.observations import MAX_LOG_BYTES
from evidence.procedure_view import load_procedure
from pipeline.activities.environments import output_redactor
from pipeline.state import ReproductionFact
from pipeline.steps import AgentTurnInput
from repair.context import (
    Redact,
    RepairContext,
    ReproductionContext,
    clean,
    earlier_attempt,
    reproduction_context,
    sandbox_reproduction_context,
)
from reviews.git_credentials import GitCredentials

# A stored procedure is at most 64,000 characters (browser.procedure.MAX_PROCEDURE_CHARS) as YAML; its JSON
# with every default filled in is larger, but never this large.
MAX_PROCEDURE_BYTES = 1024 * 1024


def repair_context(store: ArtifactStore, inp: AgentTurnInput, git_token: GitCredentials) -> RepairContext | None:
    """The context of ``inp``'s attempt, or None when the workflow passed no facts (a run recorded before
    it did: its first message is what it was)."""
    if inp.spec_ref is None and inp.reproduction is None and not inp.earlier_attempts and not inp.seed_tests:
        return None
    spec = spec_from_json(store.read_bytes(inp.spec_ref)) if inp.spec_ref is not None else None
    redact: Redact = output_redactor(spec.recipe.secrets if spec else {}, git_token).text
    return RepairContext(
        reproduction=_reproduction(store, inp.reproduction, redact) if inp.reproduction is not None else None,
        test_command=clean(spec.recipe.test, redact) if spec is not None else None,
        baseline=clean(inp.baseline_summary, redact) if inp.baseline_summary is not None else None,
        earlier_attempts=[earlier_attempt(a.attempt, a.summary, a.reason, redact) for a in inp.earlier_attempts],
        seed_tests=[clean(t, redact) for t in inp.seed_tests],
    )


def _reproduction(store: ArtifactStore, fact: ReproductionFact, redact: Redact) -> ReproductionContext:
    procedure_text = _read(store, fact.procedure_ref, MAX_PROCEDURE_BYTES)
    procedure = load_procedure(procedure_text.decode("utf-8", "replace")) if procedure_text is not None else None
    log: object = None
    if fact.log_ref is not None and (data := _read(store, fact.log_ref, MAX_LOG_BYTES)) is not None:
        try:
            log = json.loads(data)
        except (UnicodeDecodeError, ValueError):
            log = None  # said in the context's note
    sandboxed = _sandbox_reproduction(procedure_text)
    if sandboxed is not None:
        kind, yaml_text, app = sandboxed
        return sandbox_reproduction_context(
            revision=fact.revision,
            status=fact.status.value,
            kind=kind,
            procedure_yaml=yaml_text,
            record=log,
            redact=redact,
            app=app,
        )
    return reproduction_context(
        revision=fact.revision, status=fact.status.value, procedure=procedure, log=log, redact=redact
    )


def _sandbox_reproduction(stored: bytes | None) -> tuple[str, str, bool] | None:
    """``(kind, YAML, whether it runs against the app)`` of a stored command or test reproduction; None for a
    browser procedure, or one that cannot be read (told as a browser procedure is: the context says it could not
    be read)."""
    if stored is None:
        return None
    try:
        reproduction = load_reproduction(stored)
    except (ValidationError, ValueError):
        return None
    if isinstance(reproduction, Procedure):
        return None
    return kind_of(reproduction).value, to_yaml(reproduction), needs_app(reproduction)


def _read(store: ArtifactStore, ref: ArtifactRef, limit: int) -> bytes | None:
    """The artifact's bytes, or None when it is larger than ``limit`` (a context is never worth that much) or
    gone (expired by retention): the context then says it could not be read. Any other failure of the store,
    a failed integrity check included, fails the turn."""
    if ref.size > limit:
        return None
    try:
        return store.read_bytes(ref)
    except ArtifactMissingError:
        return None
