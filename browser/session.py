"""One pass over a procedure in a fresh context of the shared browser, and what a reproduction collects.

A ``RunSession`` never lets a browser failure pass for a finding about the app: a Playwright error counts as
the app's doing only while the browser is connected, the page is open and alive, and the driver still
answers (a dead driver or browser surfaces as ``TargetClosedError``). Anything else raises
``BrowserInfraError`` and marks the session ``browser_lost`` unless only its own page crashed.

Every request of the session's context (pages, popups, frames, WebSockets) goes through its origin guard:
a request to an origin the run's :class:`OriginPolicy` does not allow is aborted (``blockedbyclient``; a
WebSocket is closed before it connects) and recorded. Service workers are blocked, since requests they make
would not pass through the guard. Beneath that, the context's proxy is a dead end for every host but the
allowed ones (``OriginPolicy.proxy_bypass``), so a connection routing never sees (Chromium connects ahead
of a frame's navigation) fails too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from playwright._impl._errors import TargetClosedError
from playwright.async_api import (
    Browser,
    BrowserContext,
    Page,
    ProxySettings,
    Route,
    ViewportSize,
    WebSocketRoute,
)
from playwright.async_api import Error as PlaywrightError

from browser.checks import Verdict, evaluate, wait_until_holds
from browser.origins import OriginPolicy
from browser.procedure import (
    EXPECTATIONS,
    Click,
    Expectation,
    ExpectText,
    ExpectVisible,
    Fill,
    Goto,
    Press,
    Procedure,
    Select,
    Step,
    WaitFor,
    procedure_digest,
)
from browser.recorder import RunRecorder
from browser.results import (
    AssertionOutcome,
    BlockedRequest,
    BrowserInfraError,
    ReproductionResult,
    ReproductionStatus,
    RunOutcome,
)

VIEWPORT = ViewportSize(width=1280, height=800)
# Half the viewport: enough to follow the steps, a quarter of the pixels to encode.
VIDEO_SIZE = ViewportSize(width=640, height=400)
T = TypeVar("T")
Announce = Callable[[int, str], Awaitable[None]]


class Collected:
    """Everything one reproduction (all its runs) collects; written to ``log.json`` whatever the outcome."""

    def __init__(
        self,
        procedure: Procedure,
        base_url: str,
        out_dir: Path,
        record_video: bool = False,
        policy: OriginPolicy | None = None,
        sandbox: bool = True,
        dead_end_port: int | None = None,
    ) -> None:
        """``dead_end_port``: a local port bound and never listened on, the context's proxy for every host
        the policy does not allow (None: routing only)."""
        self.procedure = procedure
        self.record_video = record_video
        self.policy = policy if policy is not None else OriginPolicy.for_app(base_url)
        self.sandbox = sandbox
        self.dead_end_port = dead_end_port
        self.base_url = base_url.rstrip("/") + "/"
        self.out_dir = out_dir
        self.log_path = out_dir / "log.json"
        self.browser_version: str | None = None
        self.runs: list[RunOutcome] = []
        self.recorders: list[RunRecorder] = []
        self.traces: list[Path] = []
        self.screenshots: list[Path] = []
        self.videos: list[Path] = []

    def result(self, status: ReproductionStatus, detail: str, duration_s: float) -> ReproductionResult:
        return ReproductionResult(
            status=status,
            runs=self.runs,
            trace_paths=self.traces,
            screenshot_paths=self.screenshots,
            video_paths=self.videos,
            log_path=self.log_path,
            duration_s=duration_s,
            detail=detail,
            allowed_origins=list(self.policy.allowed),
            blocked_requests=self.blocked_requests(),
            blocked_dropped=sum(r.blocked_dropped for r in self.recorders),
            chromium_sandbox=self.sandbox,
        )

    def blocked_requests(self) -> list[BlockedRequest]:
        return [
            BlockedRequest(run=run, **blocked)
            for run, recorder in enumerate(self.recorders, start=1)
            for blocked in recorder.blocked
        ]

    def log(self, result: ReproductionResult | None) -> dict[str, Any]:
        """The JSON document ``log.json`` holds; ``result`` is None when the reproduction was cancelled.

        Each run's ``outcome`` is its :class:`RunOutcome`, with the screenshots of its assertions named by
        file name only (the name the artifact is stored under, after the storing side's prefix), so a
        reader can pair every assertion with its screenshots wherever the run's folder was.
        """
        return {
            "procedure": self.procedure.name,
            "procedure_digest": procedure_digest(self.procedure),
            "base_url": self.base_url,
            "browser_version": self.browser_version,
            "chromium_sandbox": self.sandbox,
            "allowed_origins": list(self.policy.allowed),
            "blocked_requests": [b.model_dump(mode="json") for b in self.blocked_requests()],
            "blocked_dropped": sum(r.blocked_dropped for r in self.recorders),
            "status": result.status.value if result is not None else "cancelled",
            "detail": result.detail if result is not None else None,
            "runs": [
                {
                    "run": index + 1,
                    "outcome": _outcome_json(self.runs[index]) if index < len(self.runs) else None,
                    "events": recorder.events,
                    "events_dropped": recorder.dropped,
                    "blocked_dropped": recorder.blocked_dropped,
                }
                for index, recorder in enumerate(self.recorders)
            ],
        }

    def write_log(self, result: ReproductionResult | None) -> None:
        """Write :meth:`log` to ``log_path``, ASCII-only: a page's text may hold what UTF-8 cannot encode
        (a lone surrogate), and a log must never fail to be written for that."""
        self.log_path.write_text(json.dumps(self.log(result), indent=2, default=str))


class RunSession:
    def __init__(self, browser: Browser, run: int, collected: Collected) -> None:
        self.browser = browser
        self.run = run
        self.collected = collected
        self.recorder = RunRecorder(collected.base_url)
        self.browser_lost = False
        self._context: BrowserContext | None = None
        self._page: Page | None = None

    async def open(self) -> None:
        """Open a fresh context with tracing and a page; any failure here is ours (BrowserInfraError)."""
        try:
            recording = self.collected.record_video
            self._context = await self.browser.new_context(
                base_url=self.collected.base_url,
                viewport=VIEWPORT,
                record_video_dir=self._video_dir if recording else None,
                record_video_size=VIDEO_SIZE if recording else None,
                service_workers="block",
                proxy=self._dead_end_proxy(),
            )
            await self._context.route(_every_url, self._guard)
            await self._context.route_web_socket(_every_url, self._guard_socket)
            self.recorder.attach(self._context)
            await self._context.tracing.start(
                screenshots=True, snapshots=True, title=f"{self.collected.procedure.name} (run {self.run})"
            )
            self._page = await self._context.new_page()
        except PlaywrightError as err:
            self.browser_lost = True
            if self._context is not None:
                with contextlib.suppress(PlaywrightError):
                    await asyncio.wait_for(self._context.close(), timeout=5)
            raise BrowserInfraError(f"could not open a browser page: {_first_line(err)}") from err
        self.recorder.attach_page(self._page)

    def _dead_end_proxy(self) -> ProxySettings | None:
        port = self.collected.dead_end_port
        if port is None:
            return None
        return ProxySettings(server=f"http://127.0.0.1:{port}", bypass=self.collected.policy.proxy_bypass())

    async def _guard(self, route: Route) -> None:
        request = route.request
        # The context may close under a request in flight; the request is gone with it, nothing to decide.
        with contextlib.suppress(PlaywrightError):
            if self.collected.policy.allows(request.url):
                await route.fallback()
                return
            self.recorder.block(request.method, request.url, request.resource_type)
            await route.abort("blockedbyclient")

    async def _guard_socket(self, socket: WebSocketRoute) -> None:
        with contextlib.suppress(PlaywrightError):
            if self.collected.policy.allows(socket.url):
                socket.connect_to_server()
                return
            self.recorder.block("GET", socket.url, "websocket")
            # Never connected to the server: the page sees the socket close.
            await socket.close(code=1008, reason="blocked by durafix: origin not allowed")

    async def execute(self, announce: Announce) -> RunOutcome:
        """Perform the steps (announcing each first), then evaluate ``bug_present`` once."""
        procedure = self.collected.procedure
        started = time.monotonic()
        steps = procedure.steps
        for index, step in enumerate(steps):
            description = step.describe()
            await announce(index, f"run {self.run}/{procedure.runs} step {index + 1}/{len(steps)}: {description}")
            self.recorder.add("step", index=index, description=description)
            error = await self._perform(step, f"run-{self.run}-step-{index + 1}")
            if error is not None:
                self.recorder.add("step_failed", index=index, error=error)
                await self._screenshot(f"run-{self.run}-step-{index + 1}-failed")
                return RunOutcome(
                    run=self.run,
                    bug_present=False,
                    failed_step=index,
                    error=f"step {index + 1} ({description}): {error}",
                    duration_s=time.monotonic() - started,
                )
        assertions = []
        for index, check in enumerate(procedure.bug_present):
            found = await self._check(evaluate(check, self.page, self.recorder))
            name = f"run-{self.run}-assert-{index + 1}"
            shot = await self._screenshot(name)
            crop = await self._element_screenshot(check, found, f"{name}-element")
            outcome = AssertionOutcome(
                index=index,
                description=check.describe(),
                holds=found.holds,
                actual=found.actual,
                error=found.error,
                screenshot=shot,
                element_screenshot=crop,
            )
            self.recorder.add(
                "assertion", **outcome.model_dump(mode="json", exclude={"screenshot", "element_screenshot"})
            )
            assertions.append(outcome)
        unevaluated = next((a for a in assertions if a.holds is None), None)
        return RunOutcome(
            run=self.run,
            bug_present=all(a.holds is True for a in assertions),
            error=None if unevaluated is None else f"assertion {unevaluated.description}: {unevaluated.error}",
            assertions=assertions,
            duration_s=time.monotonic() - started,
        )

    async def close(self) -> None:
        """Save the trace and close the context, unless the browser is gone (then there is nothing to save)."""
        if self._context is None or self.browser_lost or not self.browser.is_connected():
            return
        trace = self.collected.out_dir / f"run-{self.run}-trace.zip"
        with contextlib.suppress(PlaywrightError):
            await self._context.tracing.stop(path=trace)
            self.collected.traces.append(trace)
        with contextlib.suppress(PlaywrightError):
            await self._context.close()
        await self._keep_video()

    async def _keep_video(self) -> None:
        """Name the run's video (Playwright finishes writing it when the context closes)."""
        if not self.collected.record_video or self._page is None or self._page.video is None:
            return
        target = self.collected.out_dir / f"run-{self.run}-video.webm"
        try:
            await self._page.video.save_as(target)
        except PlaywrightError as err:
            # Video is evidence for a person, not part of the verdict: note the gap and go on.
            self.recorder.add("video_failed", error=_first_line(err))
            return
        shutil.rmtree(self._video_dir, ignore_errors=True)
        self.collected.videos.append(target)

    @property
    def _video_dir(self) -> Path:
        return self.collected.out_dir / f".run-{self.run}-video"

    @property
    def page(self) -> Page:
        assert self._page is not None, "open() the session first"
        return self._page

    async def _perform(self, step: Step, shot_name: str) -> str | None:
        """None when the step was performed; otherwise why the app did not let it be."""
        if isinstance(step, EXPECTATIONS):
            found = await self._check(wait_until_holds(step, self.page, self.recorder))
            await self._screenshot(shot_name)
            if found.holds:
                return None
            return found.error or f"did not hold within {step.timeout_ms} ms (actual: {found.actual!r})"
        try:
            await self._attempt(_act(step, self.page, self.collected.base_url))
        except PlaywrightError as err:
            return _first_line(err)
        return None

    async def _check(self, check: Coroutine[Any, Any, Verdict]) -> Verdict:
        """A check the app makes impossible (an ambiguous selector, say) could not be evaluated."""
        try:
            return await self._attempt(check)
        except PlaywrightError as err:
            return Verdict(None, None, _first_line(err))

    async def _attempt(self, action: Coroutine[Any, Any, T]) -> T:
        """Await ``action``; a Playwright error becomes BrowserInfraError when the browser, not the app, failed."""
        try:
            return await action
        except PlaywrightError as err:
            page_gone = self.page.is_closed() or self.recorder.crashed
            if isinstance(err, TargetClosedError) or page_gone or not self.browser.is_connected():
                self.browser_lost = not (self.recorder.crashed and self.browser.is_connected())
                self.recorder.add("browser_failed", error=_first_line(err), browser_lost=self.browser_lost)
                raise BrowserInfraError(f"the browser failed: {_first_line(err)}") from err
            raise

    async def _screenshot(self, name: str) -> Path | None:
        path = self.collected.out_dir / f"{name}.png"
        try:
            await self._attempt(self.page.screenshot(path=path))
        except PlaywrightError as err:
            # A screenshot is evidence, not part of the verdict: note the gap and go on.
            self.recorder.add("screenshot_failed", name=path.name, error=_first_line(err))
            return None
        self.collected.screenshots.append(path)
        return path

    async def _element_screenshot(self, check: Expectation, found: Verdict, name: str) -> Path | None:
        """A crop of the element ``check`` read, so a reviewer sees the value where the page showed it.

        Only for checks on an element that could be evaluated: an unevaluated check may have no element, or
        several. A hidden element has no pixels to crop, and ``locator.screenshot`` would wait for it to
        show for the whole timeout, so it is skipped (and the log says so) rather than waited on.
        """
        if not isinstance(check, ExpectText | ExpectVisible) or found.holds is None:
            return None
        path = self.collected.out_dir / f"{name}.png"
        locator = self.page.locator(check.selector)
        try:
            if not await self._attempt(locator.is_visible()):
                self.recorder.add("screenshot_skipped", name=path.name, reason="the element is not visible")
                return None
            await self._attempt(locator.screenshot(path=path, timeout=check.timeout_ms))
        except PlaywrightError as err:
            self.recorder.add("screenshot_failed", name=path.name, error=_first_line(err))
            return None
        self.collected.screenshots.append(path)
        return path


async def _act(step: Step, page: Page, base_url: str) -> None:
    if isinstance(step, Goto):
        await page.goto(base_url.rstrip("/") + step.path, timeout=step.timeout_ms)
    elif isinstance(step, Click):
        await page.locator(step.selector).click(timeout=step.timeout_ms)
    elif isinstance(step, Fill):
        await page.locator(step.selector).fill(step.value, timeout=step.timeout_ms)
    elif isinstance(step, Press):
        await page.locator(step.selector).press(step.key, timeout=step.timeout_ms)
    elif isinstance(step, Select):
        await page.locator(step.selector).select_option(step.value, timeout=step.timeout_ms)
    elif isinstance(step, WaitFor):
        await page.locator(step.selector).wait_for(state=step.state, timeout=step.timeout_ms)


def _every_url(_url: str) -> bool:
    return True


def _outcome_json(outcome: RunOutcome) -> dict[str, Any]:
    data = outcome.model_dump(mode="json")
    for assertion in data["assertions"]:
        for key in ("screenshot", "element_screenshot"):
            if assertion[key] is not None:
                assertion[key] = Path(assertion[key]).name
    return data


def _first_line(err: PlaywrightError) -> str:
    """Playwright messages append a multi-line call log; the first line says what went wrong."""
    lines = err.message.strip().splitlines()
    return lines[0] if lines else type(err).__name__
