"""Runs a reproduction procedure in Chromium and judges whether the bug is present.

Threading design: Playwright objects are bound to the thread (and event loop) that created them, while
Temporal calls ``run`` from many activity threads. So a ``BrowserRunner`` owns ONE dedicated thread running
an asyncio loop with Playwright's async API and a single kept browser; ``run`` submits a coroutine to that
loop and blocks its caller until the result is ready. Several runs share the browser concurrently, each in
its own fresh context (bounded by ``max_concurrent_runs``). ``on_step`` is always called on the CALLER's
thread, before the step is performed, and the step waits for it to return: a heartbeat happens in the
activity's own context, and an exception it raises (a cancelled activity) cancels the run before the next
step, closes its context, and is re-raised from ``run``; so does an exception raised in the caller's thread
while it waits for the next step (a cancellation delivered into a synchronous activity's thread).

Failure contract: a step the app cannot satisfy (a selector that never appears, a page that refuses the
connection) is a finding about the app and ends that run as incomplete; the result is ``inconclusive``. A
browser that cannot be launched, crashes, or disconnects (or whose Playwright driver dies) raises
``BrowserInfraError`` (the caller retries); it is never reported as "not reproduced". After such a failure
the browser and its driver are discarded (unless only the run's own page crashed) and the next run launches
fresh ones; a browser found dead when a run opens its context is replaced at once, so a crash between runs
costs no failed run.

Isolation: Chromium runs with its own sandbox on (as an unprivileged user when the worker is root, with a
clean environment; :mod:`browser.sandbox`), and every request a page makes is checked against the run's
allowed origins (the app's, plus those the caller names): anything else is aborted and listed in the result
and the log (:mod:`browser.origins`, :mod:`browser.session`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from opentelemetry import trace
from playwright.async_api import Browser, Playwright, async_playwright
from playwright.async_api import Error as PlaywrightError

from browser.executable import find_chromium, not_installed
from browser.origins import OriginPolicy
from browser.procedure import Procedure
from browser.results import BrowserInfraError, ReproductionResult, ReproductionStatus, RunOutcome, verdict
from browser.sandbox import DEFAULT_SANDBOX_USER, BrowserHome, SandboxUnavailable
from browser.session import Announce, Collected, RunSession
from browser.video import enable_video

logger = logging.getLogger(__name__)
# Spans through the plain OpenTelemetry API: a no-op unless the process installed an SDK.
_tracer = trace.get_tracer("durafix.browser")

# No --no-sandbox: Playwright adds it only when launched with chromium_sandbox=False (an operator's choice).
CHROMIUM_ARGS = (
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    # WebRTC may use only proxied TCP, so its UDP (STUN, peers) cannot bypass the origin guard; the proxy of
    # every context is a dead end for hosts it may not reach (browser/origins.py). The full browser reads the
    # first switch; the headless shell (browser/executable.py) ignores it and obeys only the second.
    "--webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
)

StepCallback = Callable[[int, str], None]
_Event = tuple[int, str, "asyncio.Future[None]"] | None


class BrowserRunner:
    """A kept Chromium per process; ``run`` is safe to call from any number of threads at once."""

    def __init__(
        self,
        *,
        executable_path: str | None = None,
        max_concurrent_runs: int = 2,
        launch_timeout_s: float = 30.0,
        video_dir: Path | None = None,
        sandbox: bool = True,
        sandbox_user: str = DEFAULT_SANDBOX_USER,
    ) -> None:
        """``video_dir``: record a WebM video of every run, with the system ffmpeg linked into that folder
        (raises ``VideoUnavailable`` at once when this host cannot encode video).

        ``sandbox``: Chromium's own sandbox (default on); off only when an operator asks, for hosts where it
        cannot run, and then logged at every launch. ``sandbox_user``: the unprivileged user Chromium runs as
        when this process is root."""
        self._executable_path = executable_path
        self._sandbox = sandbox
        self._sandbox_user = sandbox_user
        self._home: BrowserHome | None = None
        # Bound, never listened on: connecting to it is refused. The proxy of every context for the hosts
        # a run may not reach (browser/origins.py); held for the runner's life so no one else takes the port.
        self._dead_end: socket.socket | None = None
        self._record_video = video_dir is not None
        if video_dir is not None:
            enable_video(video_dir)
        self._max_concurrent_runs = max_concurrent_runs
        self._launch_timeout_ms = launch_timeout_s * 1000
        self._thread_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Touched only on the loop thread.
        self._playwright: Playwright | None = None
        self._browser: Browser | None = None
        self._browser_lock: asyncio.Lock | None = None
        self._slots: asyncio.Semaphore | None = None
        self._runs: set[asyncio.Task[ReproductionResult]] = set()
        self._launches = 0

    @property
    def sandboxed(self) -> bool:
        """Whether Chromium is launched with its own sandbox."""
        return self._sandbox

    @property
    def launches(self) -> int:
        """How many browsers this runner has launched: the first, plus one per relaunch after a crash or close."""
        return self._launches

    def run(
        self,
        procedure: Procedure,
        base_url: str,
        out_dir: Path,
        on_step: StepCallback | None = None,
        allowed_origins: Sequence[str] = (),
    ) -> ReproductionResult:
        """Run ``procedure`` ``procedure.runs`` times against ``base_url``; artifacts go to ``out_dir``.

        The page may reach ``base_url``'s origin and ``allowed_origins`` (``scheme://host[:port]``; a
        ``ValueError`` names one that is not an origin); every other request is aborted and listed in the
        result's ``blocked_requests`` and the log.

        Raises BrowserInfraError when the browser fails (its ``result`` holds the partial artifacts), or
        whatever ``on_step`` raised. Runs inside a ``browser run`` span (steps, runs, and the status it found).
        """
        attributes = {"steps": len(procedure.steps), "runs": procedure.runs}
        with _tracer.start_as_current_span("browser run", attributes=attributes) as span:
            result = self._run(procedure, base_url, out_dir, on_step, allowed_origins)
            span.set_attribute("status", str(result.status.value))
            return result

    def _run(
        self,
        procedure: Procedure,
        base_url: str,
        out_dir: Path,
        on_step: StepCallback | None,
        allowed_origins: Sequence[str],
    ) -> ReproductionResult:
        policy = OriginPolicy.for_app(base_url, allowed_origins)
        loop, thread = self._ensure_loop()
        events: queue.Queue[_Event] = queue.Queue()

        async def announce(index: int, description: str) -> None:
            if on_step is None:
                return
            ack: asyncio.Future[None] = loop.create_future()
            events.put((index, description, ack))
            await ack

        async def guarded() -> ReproductionResult:
            task = asyncio.current_task()
            assert task is not None
            self._runs.add(task)
            try:
                return await self._reproduce(procedure, base_url, policy, out_dir.resolve(), announce)
            finally:
                self._runs.discard(task)
                events.put(None)

        future = asyncio.run_coroutine_threadsafe(guarded(), loop)
        try:
            while (event := _next_event(events, thread)) is not None:
                index, description, ack = event
                assert on_step is not None
                on_step(index, description)
                loop.call_soon_threadsafe(_release, ack)
        except BaseException:
            # ``on_step`` raised, or an exception was raised in this thread while it waited for the next step
            # (a cancelled activity's): the run is cancelled and its context closed before it is handed back.
            future.cancel()
            _drain(events, thread)
            raise
        return future.result()

    def close(self) -> None:
        """Cancel runs in flight, close the browser, stop the driver and the loop thread. Idempotent."""
        with self._thread_lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=60)
        if self._home is not None:
            self._home.remove()
            self._home = None
        if self._dead_end is not None:
            self._dead_end.close()
            self._dead_end = None

    def __enter__(self) -> BrowserRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- loop thread ------------------------------------------------------------------------------------

    def _ensure_loop(self) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
        with self._thread_lock:
            if self._loop is None or self._thread is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()
                thread = threading.Thread(
                    target=_serve_loop, args=(loop, ready, self._init_loop_state), name="browser-runner", daemon=True
                )
                thread.start()
                ready.wait()
                self._loop, self._thread = loop, thread
            return self._loop, self._thread

    def _init_loop_state(self) -> None:
        self._browser_lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(self._max_concurrent_runs)

    async def _shutdown(self) -> None:
        # Only our runs: the loop also runs Playwright's own tasks, which must live until the driver stops.
        pending = list(self._runs)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self._browser is not None:
            with contextlib.suppress(PlaywrightError):
                await self._browser.close()
            self._browser = None
        await self._stop_driver()

    async def _stop_driver(self) -> None:
        if self._playwright is None:
            return
        # A driver that died with the browser may fail or hang while stopping; it is discarded either way.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._playwright.stop(), timeout=10)
        self._playwright = None

    async def _ensure_browser(self) -> Browser:
        assert self._browser_lock is not None
        async with self._browser_lock:
            if self._browser is not None and self._browser.is_connected():
                return self._browser
            self._browser = None
            executable = self._executable_path or find_chromium()
            if executable is None:
                raise BrowserInfraError(not_installed())
            plan = self._launch_plan(executable).plan
            if not plan.sandbox:
                logger.warning(
                    "launching chromium WITHOUT its sandbox (--no-sandbox), as the operator configured "
                    "(DURAFIX_BROWSER_SANDBOX=0): a page that exploits the renderer runs as this worker's user"
                )
            failure: Exception | None = None
            for _ in range(2):
                try:
                    if self._playwright is None:
                        self._playwright = await async_playwright().start()
                    self._browser = await self._playwright.chromium.launch(
                        executable_path=plan.executable,
                        args=list(CHROMIUM_ARGS),
                        chromium_sandbox=plan.sandbox,
                        env=dict(plan.env),
                        downloads_path=plan.downloads,
                        timeout=self._launch_timeout_ms,
                    )
                except (PlaywrightError, OSError) as err:
                    failure = err
                    # The driver may be what died: start a fresh one for the second attempt.
                    await self._stop_driver()
                    continue
                self._launches += 1
                return self._browser
            hint = ""
            if plan.sandbox:
                hint = (
                    " (its sandbox is on: it needs unprivileged user namespaces; on a host without them an "
                    "operator may set DURAFIX_BROWSER_SANDBOX=0, see docs/security.md)"
                )
            raise BrowserInfraError(f"could not launch chromium ({executable}){hint}: {failure}")

    def _dead_end_port(self) -> int:
        if self._dead_end is None:
            self._dead_end = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._dead_end.bind(("127.0.0.1", 0))
        port: int = self._dead_end.getsockname()[1]
        return port

    def _launch_plan(self, executable: str) -> BrowserHome:
        if self._home is None:
            try:
                self._home = BrowserHome(executable, sandbox=self._sandbox, user=self._sandbox_user)
            except (SandboxUnavailable, OSError) as err:
                raise BrowserInfraError(f"cannot prepare chromium's sandbox: {err}") from err
        return self._home

    # ---- one reproduction -------------------------------------------------------------------------------

    async def _reproduce(
        self, procedure: Procedure, base_url: str, policy: OriginPolicy, out_dir: Path, announce: Announce
    ) -> ReproductionResult:
        assert self._slots is not None
        async with self._slots:
            started = time.monotonic()
            out_dir.mkdir(parents=True, exist_ok=True)
            collected = Collected(
                procedure,
                base_url,
                out_dir,
                record_video=self._record_video,
                policy=policy,
                sandbox=self._sandbox,
                dead_end_port=self._dead_end_port(),
            )
            try:
                for run in range(1, procedure.runs + 1):
                    collected.runs.append(await self._run_once(run, collected, announce))
            except BrowserInfraError as err:
                result = collected.result(ReproductionStatus.INFRA_FAILURE, str(err), time.monotonic() - started)
                collected.write_log(result)
                raise BrowserInfraError(str(err), result) from err
            except BaseException:
                collected.write_log(None)
                raise
            status, detail = verdict(collected.runs)
            result = collected.result(status, detail, time.monotonic() - started)
            collected.write_log(result)
            return result

    async def _run_once(self, run: int, collected: Collected, announce: Announce) -> RunOutcome:
        session = await self._open_session(run, collected)
        collected.recorders.append(session.recorder)
        try:
            return await session.execute(announce)
        except BrowserInfraError:
            if session.browser_lost:
                await self._discard(session.browser)
            raise
        finally:
            await session.close()

    async def _open_session(self, run: int, collected: Collected) -> RunSession:
        try:
            return await self._session_on_kept_browser(run, collected)
        except BrowserInfraError:
            # The kept browser or its driver may have died since the last run: once more, on a fresh one.
            return await self._session_on_kept_browser(run, collected)

    async def _session_on_kept_browser(self, run: int, collected: Collected) -> RunSession:
        browser = await self._ensure_browser()
        collected.browser_version = browser.version
        session = RunSession(browser, run, collected)
        try:
            await session.open()
        except BrowserInfraError:
            await self._discard(browser)
            raise
        return session

    async def _discard(self, browser: Browser) -> None:
        """Drop ``browser`` and its driver so the next run relaunches both; a no-op if already replaced."""
        assert self._browser_lock is not None
        async with self._browser_lock:
            if self._browser is not browser:
                return
            self._browser = None
            # The browser may be half-dead: closing is best effort and bounded.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(browser.close(), timeout=5)
            await self._stop_driver()


def _next_event(events: queue.Queue[_Event], thread: threading.Thread) -> _Event:
    """The run's next announcement, or None once it ended; a runner closed under a queued run ends it too."""
    while True:
        try:
            return events.get(timeout=1.0)
        except queue.Empty:
            if not thread.is_alive():
                raise BrowserInfraError("the browser runner was closed before the run finished") from None


def _drain(events: queue.Queue[_Event], thread: threading.Thread) -> None:
    """Wait until a cancelled run has ended (its context closed); announcements it still makes are dropped."""
    with contextlib.suppress(BrowserInfraError):
        while _next_event(events, thread) is not None:
            pass


def _release(ack: asyncio.Future[None]) -> None:
    if not ack.done():
        ack.set_result(None)


def _serve_loop(loop: asyncio.AbstractEventLoop, ready: threading.Event, init: Callable[[], None]) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(init)
    loop.call_soon(ready.set)
    try:
        loop.run_forever()
    finally:
        loop.close()
