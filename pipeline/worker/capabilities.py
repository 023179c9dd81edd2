"""What this host can serve, per task queue: probed before ``durafix worker`` polls, and advertised.

Each queue needs something of the host or of the configuration (:func:`probe`):

- ``orchestration``: nothing but Temporal, which the worker reaches as it connects;
- ``forge``: forge credentials (a token, or a GitHub App's ID and private key file), git, and the forge's API
  answering;
- ``environments``: git and the configured provider's prerequisites: the Docker engine at
  ``DURAFIX_DOCKER_HOST`` answering ``_ping`` and the CA bundle (``DURAFIX_CA_BUNDLE``) readable (docker), and,
  under ``--check`` only, one real ``pip download`` in a setup container with that trust
  (:mod:`environments.docker.registry_reach`); or a bubblewrap that can create namespaces and
  ``socat`` (the bridge of setup's egress proxy), unless the operator allowed running unsandboxed (local);
- ``browser``: Chromium, launchable the way the browser runner launches it (and ffmpeg with video on);
- ``model``: git and a model endpoint configured (a key, or a base URL on this host) and answering.

A problem is *lasting* (this host or its configuration lacks something: the worker refuses to start, exit 2,
naming the queue, what is missing and how to fix it) or *passing* (a remote service did not answer in time:
the worker starts, says so, and its activities retry; ``durafix worker --check`` still fails on it). Every
probe a worker's start runs is cheap: a lookup, a ``--version``, one request with a short timeout. What costs an
image build (a registry reached from a container) is probed by ``--check`` only (:attr:`Requirement.checked`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from pipeline.config import DurafixConfig
from pipeline.steps import TaskQueue
from pipeline.worker.queue_settings import short_name

REQUEST_TIMEOUT_S = 3.0
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


class Missing(Exception):
    """A probe's finding that the queue cannot be served; ``lasting``: see the module."""

    def __init__(self, message: str, *, lasting: bool = True) -> None:
        super().__init__(message)
        self.lasting = lasting


@dataclass(frozen=True)
class QueueCheck:
    """One queue's probe: what it needs, what was found, and (when it cannot be served) the problem."""

    queue: TaskQueue
    needs: str
    found: list[str] = field(default_factory=list)
    problem: str | None = None
    lasting: bool = True

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def status(self) -> str:
        if self.ok:
            return "found"
        return "missing" if self.lasting else "unreachable"


@dataclass(frozen=True)
class Requirement:
    """What a queue needs (said in ``--check``'s table) and the probes that look for it, each returning what
    it found (``git 2.39.5``) or raising :class:`Missing`."""

    needs: str
    probes: Sequence[Callable[[DurafixConfig], str]]
    # Run by ``--check`` only, after ``probes`` passed: they build or download (a probe with nothing to do for
    # this configuration answers "").
    checked: Sequence[Callable[[DurafixConfig], str]] = ()


def probe(config: DurafixConfig, queues: Sequence[TaskQueue], *, thorough: bool = False) -> list[QueueCheck]:
    """Probe each of ``queues`` (in order; a probe shared by several queues runs once); ``thorough`` (``--check``):
    also each requirement's :attr:`Requirement.checked` probes."""
    seen: dict[Callable[[DurafixConfig], str], str | Missing] = {}
    checks = []
    for queue in queues:
        requirement = REQUIREMENTS[queue]
        found: list[str] = []
        problem: Missing | None = None
        for step in [*requirement.probes, *(requirement.checked if thorough else ())]:
            if step not in seen:
                try:
                    seen[step] = step(config)
                except Missing as err:
                    seen[step] = err
            result = seen[step]
            if isinstance(result, Missing):
                problem = result
                break
            if result:
                found.append(result)
        checks.append(
            QueueCheck(
                queue,
                requirement.needs,
                found,
                None if problem is None else str(problem),
                True if problem is None else problem.lasting,
            )
        )
    return checks


def refusal(checks: Sequence[QueueCheck]) -> str | None:
    """Why the worker must not start (every lasting problem, one line per queue), or None."""
    lines = [f"cannot serve the {short_name(c.queue)} queue: {c.problem}" for c in checks if not c.ok and c.lasting]
    if not lines:
        return None
    return "\n".join([*lines, "(`durafix worker --check --queues ...` lists what each queue needs)"])


def warnings(checks: Sequence[QueueCheck]) -> list[str]:
    """The passing problems: the worker starts anyway, and says these."""
    return [
        f"the {short_name(c.queue)} queue: {c.problem}; its activities retry"
        for c in checks
        if not c.ok and not c.lasting
    ]


def advertisement(checks: Sequence[QueueCheck]) -> str:
    """One line: the queues served and what was found for each (``browser (chromium 156.0.8078.114)``)."""
    parts = [f"{short_name(c.queue)} ({', '.join(c.found)})" if c.found else short_name(c.queue) for c in checks]
    return "serves " + "; ".join(parts)


def table(checks: Sequence[QueueCheck]) -> str:
    """``--check``'s table: queue, what it needs, found/missing/unreachable, and what was found or the problem."""
    rows = [("queue", "needs", "status", "detail")]
    rows += [(short_name(c.queue), c.needs, c.status, _detail(c)) for c in checks]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(
        "  ".join([*(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)), row[3]]).rstrip()
        for row in rows
    )


def _detail(check: QueueCheck) -> str:
    if not check.ok:
        return check.problem or ""
    return ", ".join(check.found) or "nothing to probe (reached when the worker connects)"


# ---- the probes ------------------------------------------------------------------------------------------


def git(config: DurafixConfig) -> str:
    found = shutil.which("git")
    if found is None:
        raise Missing("git is not installed (no 'git' on PATH); install it (Debian: apt-get install git)")
    said = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=10, check=False).stdout
    return said.strip().removesuffix(".").replace(" version ", " ") or "git"


def chromium(config: DurafixConfig) -> str:
    from browser.availability import ChromiumUnavailable, chromium_version

    try:
        return chromium_version(sandbox=config.browser_sandbox, video=config.browser_video)
    except ChromiumUnavailable as err:
        raise Missing(str(err)) from err


def environment_provider(config: DurafixConfig) -> str:
    if config.environment_provider == "docker":
        return f"{docker_engine(config)}, {docker_trust(config)}"
    if config.environment_provider == "local":
        return bubblewrap(config)
    raise Missing(
        f"unknown environment provider {config.environment_provider!r}; "
        "set DURAFIX_ENVIRONMENT_PROVIDER to local or docker"
    )


def docker_trust(config: DurafixConfig) -> str:
    """The CA bundle the Docker provider's images trust (``DURAFIX_CA_BUNDLE``), read as a build reads it."""
    from environments.ca_bundle import CABundle, CABundleError

    path = config.ca_bundle_path()
    if path is None:
        return "CA bundle: Debian's only (DURAFIX_CA_BUNDLE=none)"
    try:
        bundle = CABundle.read(path)
    except CABundleError as err:
        raise Missing(str(err)) from err
    return f"CA bundle {path} ({bundle.short()})"


def docker_registries(config: DurafixConfig) -> str:
    """One real ``pip download`` in a setup container with the configured trust and egress (docker only)."""
    if config.environment_provider != "docker":
        return ""
    from environments.docker import DockerProvider
    from environments.docker.registry_reach import try_registries
    from pipeline.services import Services

    provider = Services(config).provider("docker")
    assert isinstance(provider, DockerProvider)
    reach = try_registries(provider.images, config.state_dir / "environments" / "registry-check")
    if not reach.reached:
        raise Missing(f"an image build cannot install from the registries: {reach.detail}")
    return reach.detail


def docker_engine(config: DurafixConfig) -> str:
    from environments.docker.engine import engine_version
    from environments.registry import ProviderUnavailableError

    host = config.docker_host or os.environ.get("DOCKER_HOST", "")
    if not host:
        raise Missing("the docker provider needs a Docker engine: set DURAFIX_DOCKER_HOST (or DOCKER_HOST)")
    try:
        return engine_version(host)
    except ProviderUnavailableError as err:
        raise Missing(f"{err}; start it, or point DURAFIX_DOCKER_HOST at an engine that answers") from err


def bubblewrap(config: DurafixConfig) -> str:
    from environments.egress import SOCAT
    from environments.sandbox import BWRAP, Sandbox, SandboxUnavailableError, bwrap_problem, bwrap_version

    try:
        sandbox = Sandbox.detect(unsandboxed=config.unsandboxed, bwrap=BWRAP)
    except SandboxUnavailableError as err:
        raise Missing(str(err)) from err
    if not sandbox.sandboxed:
        return f"unsandboxed (DURAFIX_UNSANDBOXED=1; {bwrap_problem(BWRAP)})"
    if not Path(SOCAT).exists():
        raise Missing(
            f"{SOCAT} is missing: a setup with setup_network: true reaches the package registries through a bridge "
            "that needs it; install the Debian package socat"
        )
    return bwrap_version(BWRAP)


def model_endpoint(config: DurafixConfig) -> str:
    base = config.model_base_url.rstrip("/")
    host = urlsplit(base).hostname or ""
    if not config.model_api_key and host not in LOCAL_HOSTS:
        raise Missing(f"no model key for {base}: set OPENAI_API_KEY, or OPENAI_BASE_URL to an endpoint on this host")
    headers = {"Authorization": f"Bearer {config.model_api_key}"} if config.model_api_key else {}
    status = _answers(f"{base}/models", headers, what=f"the model endpoint {base}", fix="OPENAI_BASE_URL")
    if status in (401, 403):
        raise Missing(f"the model endpoint {base} refuses the key (HTTP {status}); check OPENAI_API_KEY")
    return f"model endpoint {base}"


def forge_api(config: DurafixConfig) -> str:
    api = config.forge_api_url.rstrip("/")
    headers = {"Accept": "application/vnd.github+json"}
    if config.forge_token:
        credential = "token"
        headers["Authorization"] = f"token {config.forge_token}"
    elif config.github_app_id and config.github_app_private_key_file:
        key = Path(config.github_app_private_key_file)
        if not key.is_file() or not os.access(key, os.R_OK):
            raise Missing(
                f"the GitHub App's private key {key} is not a readable file; check DURAFIX_GITHUB_APP_PRIVATE_KEY_FILE"
            )
        credential = f"app {config.github_app_id}"
    else:
        raise Missing(
            "no forge credentials: set DURAFIX_FORGE_TOKEN, or DURAFIX_GITHUB_APP_ID and "
            "DURAFIX_GITHUB_APP_PRIVATE_KEY_FILE for a GitHub App"
        )
    status = _answers(api, headers, what=f"the forge API {api}", fix="DURAFIX_FORGE_API_URL")
    if status == 401:
        raise Missing(f"the forge API {api} refuses the token (HTTP 401); check DURAFIX_FORGE_TOKEN")
    return f"forge {api} ({credential})"


def _answers(url: str, headers: dict[str, str], *, what: str, fix: str) -> int:
    """The HTTP status ``url`` answers a GET with; :class:`Missing` (passing) when nothing answers in time."""
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise Missing(f"{what} does not answer ({reason}); check {fix} and that it is up", lasting=False) from err


REQUIREMENTS: dict[TaskQueue, Requirement] = {
    # Temporal is reached when the worker connects: a server not up yet is waited for, not a reason to refuse.
    TaskQueue.ORCHESTRATION: Requirement("Temporal", []),
    TaskQueue.FORGE: Requirement("forge credentials, git, the forge API", [git, forge_api]),
    TaskQueue.ENVIRONMENTS: Requirement(
        "git, bubblewrap (local) or a Docker engine (docker)", [git, environment_provider], [docker_registries]
    ),
    TaskQueue.BROWSER: Requirement("Chromium", [chromium]),
    TaskQueue.MODEL: Requirement("git, a model endpoint", [git, model_endpoint]),
}
