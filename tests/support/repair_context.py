"""The stored facts of a cart reproduction, shaped as a run stores them: the procedure as the validated model's
JSON (``browser.prepare_procedure`` stores that) and a ``log.json`` written by the runner's own log writer,
with events recorded through the runner's recorder."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from browser.procedure import parse_procedure
from browser.recorder import RunRecorder
from browser.results import AssertionOutcome, ReproductionResult, ReproductionStatus, RunOutcome
from browser.session import Collected

PROCEDURE = Path(__file__).resolve().parents[2] / "examples" / "cart" / "repro.yaml"
BASE_URL = "http://127.0.0.1:43117"


def cart_procedure_json() -> bytes:
    return parse_procedure(PROCEDURE.read_text()).model_dump_json(indent=2).encode()


def cart_log(
    actuals: Sequence[str],
    holds: bool = True,
    events: Sequence[tuple[str, Mapping[str, Any]]] = (),
    *,
    status: ReproductionStatus | None = None,
    detail: str = "",
    base_url: str = BASE_URL,
    out_dir: Path = Path("out"),
    screenshots: bool = False,
) -> bytes:
    """The runner's ``log.json`` for the cart procedure: run ``i + 1``'s one check read ``actuals[i]``;
    ``events`` (kind, fields), as the recorder notes them, happened in run 1. With ``screenshots`` each check
    names its screenshots as the runner names them; ``status`` defaults to what ``holds`` says."""
    procedure = parse_procedure(PROCEDURE.read_text())
    collected = Collected(procedure, base_url, out_dir)
    for run, actual in enumerate(actuals, start=1):
        recorder = RunRecorder(collected.base_url)
        for kind, fields in events if run == 1 else ():
            recorder.add(kind, **fields)
        collected.recorders.append(recorder)
        check = AssertionOutcome(
            index=0,
            description=procedure.bug_present[0].describe(),
            holds=holds,
            actual=actual,
            screenshot=Path(f"run-{run}-assert-1.png") if screenshots else None,
            element_screenshot=Path(f"run-{run}-assert-1-element.png") if screenshots else None,
        )
        collected.runs.append(RunOutcome(run=run, bug_present=holds, assertions=[check], duration_s=0.5))
    if status is None:
        status = ReproductionStatus.REPRODUCED if holds else ReproductionStatus.NOT_REPRODUCED
    result = ReproductionResult(
        status=status,
        runs=collected.runs,
        trace_paths=[],
        screenshot_paths=[],
        log_path=collected.log_path,
        duration_s=1.0,
        detail=detail,
    )
    return json.dumps(collected.log(result), indent=2).encode()


PAGE_EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("console", {"level": "error", "text": "TypeError: item.quantity is undefined", "location": "/app.js:12"}),
    ("console", {"level": "log", "text": "cart rendered", "location": "/app.js:30"}),
    ("requestfailed", {"method": "GET", "url": f"{BASE_URL}/api/prices?c=1", "failure": "net::ERR_ABORTED"}),
    ("response", {"method": "POST", "url": f"{BASE_URL}/api/cart", "status": 500}),
]
