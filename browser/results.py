"""What a reproduction found, and the error that says the browser (not the app) failed."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel


class ReproductionStatus(StrEnum):
    REPRODUCED = "reproduced"
    NOT_REPRODUCED = "not_reproduced"
    # Runs disagreed, or the procedure could not be completed on the app (a step or an assertion failed).
    INCONCLUSIVE = "inconclusive"
    # Only ever carried by BrowserInfraError.result: our browser failed, which says nothing about the bug.
    INFRA_FAILURE = "infra_failure"


class AssertionOutcome(BaseModel):
    """One ``bug_present`` assertion: ``holds`` is None when it could not be evaluated (e.g. no element).

    ``actual`` is what the page showed (the text, ``visible``/``not visible``, the URL, the status).
    ``screenshot`` is the page right after the assertion; ``element_screenshot`` the crop of the element it
    read, taken only for assertions on an element (``expect_text``, ``expect_visible``) that could be
    evaluated and whose element is visible. Both are None when not taken (the log says why).
    """

    index: int
    description: str
    holds: bool | None
    actual: str | None = None
    error: str | None = None
    screenshot: Path | None = None
    element_screenshot: Path | None = None


class RunOutcome(BaseModel):
    """One pass over the procedure in a fresh browser context.

    ``failed_step`` is the 0-based index of the step that could not be performed (then no assertion was
    evaluated and ``bug_present`` is False); ``error`` says why a step failed or an assertion could not be
    evaluated.
    """

    run: int
    bug_present: bool
    failed_step: int | None = None
    error: str | None = None
    assertions: list[AssertionOutcome] = []
    duration_s: float

    @property
    def complete(self) -> bool:
        """All steps were performed and every assertion was evaluated to true or false."""
        return self.failed_step is None and all(a.holds is not None for a in self.assertions)


class BlockedRequest(BaseModel):
    """A request the page made to an origin it may not reach; it was aborted before leaving the browser.

    ``resource_type`` is Playwright's (``fetch``, ``xhr``, ``document``, ``image``, ``websocket``, ...).
    """

    run: int
    method: str
    url: str
    resource_type: str


class ReproductionResult(BaseModel):
    """``blocked_requests`` lists every request aborted by the origin policy (``allowed_origins``: the app's
    first), at most ``MAX_BLOCKED`` per run; ``blocked_dropped`` counts those beyond. ``chromium_sandbox``
    is False only when the operator turned Chromium's sandbox off."""

    status: ReproductionStatus
    runs: list[RunOutcome]
    trace_paths: list[Path]
    screenshot_paths: list[Path]
    log_path: Path
    # One WebM per run, only when the runner records video.
    video_paths: list[Path] = []
    duration_s: float
    detail: str
    allowed_origins: list[str] = []
    blocked_requests: list[BlockedRequest] = []
    blocked_dropped: int = 0
    chromium_sandbox: bool = True


class BrowserInfraError(RuntimeError):
    """The browser could not be launched, crashed or disconnected: retry, never read it as a finding.

    ``result`` holds what was collected before the failure (status INFRA_FAILURE) when a run had started.
    """

    def __init__(self, message: str, result: ReproductionResult | None = None) -> None:
        super().__init__(message)
        self.result = result


def verdict(runs: list[RunOutcome], *, quote_actual: bool = True) -> tuple[ReproductionStatus, str]:
    """Reproduced only when every run completed and showed the bug; not reproduced only when every run
    completed without it; anything else (runs disagree, a run could not be completed) is inconclusive.

    ``quote_actual=False``: the detail names each assertion and whether it held, never what it read (a command
    reproduction reads what the repository's code printed, which the detail must not carry to a ticket, the
    workflow's history or a prompt; the stored record holds it)."""
    total = len(runs)
    incomplete = [r for r in runs if not r.complete]
    if incomplete:
        first = incomplete[0]
        return (
            ReproductionStatus.INCONCLUSIVE,
            f"{len(incomplete)} of {total} runs could not be completed; run {first.run}: {first.error}",
        )
    present = [r.run for r in runs if r.bug_present]
    if len(present) == total:
        held = "; ".join(f"{a.description} held{_actual(a, quote_actual)}" for a in runs[0].assertions)
        return ReproductionStatus.REPRODUCED, f"bug present in {total} of {total} runs: {held}"
    if not present:
        failed = next(a for a in runs[0].assertions if not a.holds)
        return (
            ReproductionStatus.NOT_REPRODUCED,
            f"bug absent in {total} of {total} runs: {failed.description} did not hold{_actual(failed, quote_actual)}",
        )
    return ReproductionStatus.INCONCLUSIVE, f"runs disagree: bug present in runs {present} of {total}"


def _actual(assertion: AssertionOutcome, quote: bool) -> str:
    return f" (actual {assertion.actual!r})" if quote else ""
