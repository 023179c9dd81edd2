"""A hostile setup with ``setup_network: true`` on the Docker provider: it installs a real package from PyPI
through the egress proxy, and then tries the worker's own services through every door it has.

Real parts only: the Docker provider's ``run_checks`` against a real engine (the app image's base bootstrapped
from Debian packages, the setup in setup containers committed into the app image, then the tests in a container
of their own), the egress proxy it starts, PyPI, and listeners standing in for the worker's services: on its
``127.0.0.1``, on its non-loopback interface address, and on the gateway address of a Docker bridge network
(the address a container on a bridge reaches its host at). The hostile step asks the proxy for tunnels to each
listener (by address, and by an allowed name that resolves to loopback), to the cloud metadata address, and for
a plain-HTTP forward, and connects straight to each listener's address. The metadata address is only ever asked
of the proxy, which refuses it before connecting; the direct attempts leave a container without a route
anywhere, so this test sends no packet but through the proxy.

Asserted from outside: the package is installed in the app image; the setup ran as the app's user with no
capability and no new privileges; every attempt failed; the listeners saw no connection; the proxy's log,
written into the checks' log, names only registry hosts as reached and every attempt as refused; the tests that
follow have no way out (no socket, no bridge, no proxy variables, nothing of the proxy in the image); no setup
container and no proxy process outlives the setup. And: a failing setup command leaves no image behind; a
command past the setup timeout is killed; a setup container a dead worker left is replaced; the committed image
feeds the dependency image like a built one; the worker's egress hosts reach the Docker provider.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from environments.checks import SetupError, SetupSettings
from environments.docker import DockerProvider
from environments.docker.images import APP_REPOSITORY, EGRESS_PACKAGES, SetupStepError, base_recipe, recipe_hash
from environments.docker.setup_containers import setup_container_name
from environments.egress import DEFAULT_REGISTRY_HOSTS, INSIDE_SOCKET
from environments.interface import AppRecipe, ImageRecipe, Progress, ReadinessProbe, RecoverySpec, TestRunResult
from environments.processes import owned_pids
from environments.registry import get_provider
from infra.docker.engine import DockerEngine
from tests.support.containers import sh_in_image
from tests.support.docker import docker_client, docker_engine, image_cache
from tests.support.listeners import EGRESS_ATTACK, Listener, listen, worker_address

pytestmark = [pytest.mark.slow, pytest.mark.docker]

# The Docker engine fixtures of the provider tests (one engine per session, the shared image cache).
__all__ = ["docker_client", "docker_engine", "image_cache"]

RUN = "repair:acme/docker-egress#5"
PACKAGES = ["python3", "python3-pip"]
RESULTS = "== durafix-egress-results: "

# Who setup ran as: its uid and capability sets, kept in the image for the tests to report.
IDENTITY = "id -u > identity.txt && grep -E '^(CapEff|CapBnd|CapPrm|NoNewPrivs):' /proc/self/status >> identity.txt"

# The tests that follow setup: what setup left in the image, and whether any way out is left to them.
TESTS = (
    f"SOCKET = {INSIDE_SOCKET!r}\nRESULTS = {RESULTS!r}\n"
    + r"""
import json, os, socket
seen = {
    "socket": os.path.lexists(SOCKET),
    "proxy vars": sorted(k for k in os.environ if "proxy" in k.lower()),
    "six": os.path.isfile(".deps/six.py") and os.path.isdir(".deps/six-1.16.0.dist-info"),
    "attempts": json.load(open("attempts.json")),
    "identity": open("identity.txt").read().split("\n"),
}
try:
    socket.create_connection(("127.0.0.1", 3128), 5).close()
    seen["bridge"] = "reached"
except OSError as exc:
    seen["bridge"] = f"blocked: {exc}"
print(RESULTS + json.dumps(seen))
"""
)


@pytest.fixture
def gateway(docker_client: docker.DockerClient) -> Iterator[str]:
    """The host's address on a Docker bridge network of the engine (the network is removed afterwards)."""
    network = docker_client.networks.create(f"durafix-egress-test-{uuid.uuid4().hex[:8]}", driver="bridge")
    try:
        network.reload()
        yield str(network.attrs["IPAM"]["Config"][0]["Gateway"])
    finally:
        network.remove()


@pytest.fixture
def listeners(gateway: str) -> Iterator[dict[str, Listener]]:
    made = {
        "127.0.0.1": listen("127.0.0.1"),
        "host address": listen(worker_address(excluded=frozenset({gateway}))),
        "bridge gateway": listen(gateway),
    }
    yield made
    for listener in made.values():
        listener.sock.close()


def _recipe(setup: list[str], test: str = "true") -> AppRecipe:
    return AppRecipe(
        setup=setup,
        setup_network=True,
        start="true",
        test=test,
        readiness=ReadinessProbe(path="/"),
        image=ImageRecipe(packages=PACKAGES),
    )


def _spec(recipe: AppRecipe) -> RecoverySpec:
    return RecoverySpec(repository="acme/docker-egress", clone_url="x", base_revision="5e" * 20, recipe=recipe)


def _marked_workspace(tmp_path: Path) -> Path:
    """A workspace of one file holding a fresh marker, so that its app image is new to the engine."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "marker.txt").write_text(uuid.uuid4().hex)
    return ws


def _provider(tmp_path: Path, docker_engine: DockerEngine, image_cache: Path) -> DockerProvider:
    return DockerProvider(tmp_path / "state", docker_engine.docker_host, image_cache_dir=image_cache)


def _run_checks(
    provider: DockerProvider,
    recipe: AppRecipe,
    ws: Path,
    step: str,
    log: Path,
    setup_timeout_s: float,
    test_timeout_s: float,
    progress: Progress | None = None,
) -> TestRunResult:
    """The checks of ``recipe`` in ``ws`` as step ``step`` of the test's run, logged to ``log``."""
    return provider.run_checks(
        _spec(recipe),
        str(ws),
        run_id=RUN,
        op_id=f"{RUN}:{step}",
        log_path=log,
        setup_timeout_s=setup_timeout_s,
        test_timeout_s=test_timeout_s,
        progress=progress,
    )


def test_only_a_networked_setup_gets_the_egress_packages_in_its_base_image() -> None:
    offline = AppRecipe(setup=["true"], start="true", test="true", readiness=ReadinessProbe(path="/"))
    assert base_recipe(offline) == offline.image
    networked = _recipe(["true"])
    assert sorted(base_recipe(networked).packages) == sorted({*PACKAGES, *EGRESS_PACKAGES})
    assert recipe_hash(base_recipe(networked)) != recipe_hash(networked.image)
    assert base_recipe(_recipe([])).packages == PACKAGES  # no setup: nothing runs behind the proxy


def test_docker_setup_reaches_pypi_through_the_proxy_and_nothing_of_the_worker(
    docker_engine: DockerEngine,
    docker_client: docker.DockerClient,
    image_cache: Path,
    listeners: dict[str, Listener],
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "attack.py").write_text(EGRESS_ATTACK)
    (ws / "tests.py").write_text(TESTS)
    loopback = listeners["127.0.0.1"]
    tunnels = {name: listener.authority for name, listener in listeners.items()}
    tunnels |= {
        "localhost": f"localhost:{loopback.port}",
        "metadata:80": "169.254.169.254:80",
        "metadata:443": "169.254.169.254:443",
    }
    forwards = {"127.0.0.1": f"http://{loopback.authority}/", "metadata": "http://169.254.169.254/latest/meta-data/"}
    direct = {name: (listener.address, listener.port) for name, listener in listeners.items()}
    targets = {"connect": tunnels, "get": forwards, "direct": direct}
    recipe = _recipe(
        [
            IDENTITY,
            "PIP_CONFIG_FILE=/dev/null python3 -m pip install --no-cache-dir --disable-pip-version-check "
            "--target .deps --index-url https://pypi.org/simple six==1.16.0",
            f"python3 attack.py '{json.dumps(targets)}'",
        ],
        test="python3 tests.py",
    )
    # The listeners' ports are allowed, and "localhost" is an allowed name, so that what refuses those tunnels
    # is the check of the resolved address, not the port or name rules.
    provider = DockerProvider(
        tmp_path / "state",
        docker_engine.docker_host,
        image_cache_dir=image_cache,
        stop_timeout_s=5,
        egress_hosts=(*DEFAULT_REGISTRY_HOSTS, "localhost"),
        egress_ports=(443, *(listener.port for listener in listeners.values())),
    )
    progress: list[str] = []
    log = tmp_path / "checks.log"
    try:
        result = _run_checks(provider, recipe, ws, "checks", log, 300, 120, progress=progress.append)
        text = log.read_text()
        assert result.passed, text
        image = next(line.split()[-1] for line in text.splitlines() if line.startswith("# setup ran in setup"))
        config = docker_client.images.get(image).attrs["Config"]
    finally:
        assert provider.cleanup_run(RUN).complete
        provider.close()
    seen = json.loads(next(line for line in text.splitlines() if line.startswith(RESULTS)).removeprefix(RESULTS))

    # PyPI was reached: a real package is installed in the app image.
    assert seen["six"] is True, text
    # Setup ran as the app's user, with no capability at all and no way to gain one.
    identity = dict(line.split(":\t") for line in seen["identity"][1:] if line)
    assert seen["identity"][0] == "65534"
    assert identity == {"CapEff": "0" * 16, "CapBnd": "0" * 16, "CapPrm": "0" * 16, "NoNewPrivs": "1"}

    # Every other attempt failed, and nothing of the worker saw a connection.
    attempts = seen["attempts"]
    expected = {f"connect {name}" for name in tunnels} | {f"get {name}" for name in forwards}
    assert set(attempts) == expected | {f"direct {name}" for name in direct}
    assert {name: verdict for name, verdict in attempts.items() if not verdict.startswith("blocked")} == {}
    time.sleep(0.5)  # a connection the proxy had made would have been accepted by now; none is expected
    assert {name: listener.seen for name, listener in listeners.items()} == {name: [] for name in listeners}

    # The proxy's log, as the checks' log has it: only registry hosts reached, every attempt refused.
    egress = [line.removeprefix("# egress: ") for line in text.splitlines() if line.startswith("# egress: ")]
    reached = {line.split()[1].rsplit(":", 1)[0] for line in egress if line.startswith("reached ")}
    assert {"pypi.org", "files.pythonhosted.org"} <= reached <= set(DEFAULT_REGISTRY_HOSTS), egress
    refused = [line for line in egress if line.startswith("refused ")]
    assert f"refused localhost:{loopback.port} at 127.0.0.1: resolves to a loopback address" in refused
    for authority in [*(listener.authority for listener in listeners.values()), "169.254.169.254:443"]:
        assert f"refused {authority}: not an allowed registry host" in refused, egress
    assert "refused 169.254.169.254:80: not an allowed registry host" in refused
    assert f"refused {loopback.authority}: only CONNECT tunnels are forwarded" in refused
    assert "refused 169.254.169.254:80: only CONNECT tunnels are forwarded" in refused
    assert not [line for line in egress if "169.254" in line and " at " in line]
    assert any(line.startswith("setup: egress reached ") and "pypi.org:443" in line for line in progress)

    # The tests after it: no socket, no bridge, no proxy variables; the image holds nothing of the proxy.
    assert seen["socket"] is False and seen["proxy vars"] == [] and seen["bridge"].startswith("blocked")
    assert not [entry for entry in config.get("Env") or [] if "proxy" in entry.lower()]
    assert config["User"] == "0:0" and config["Cmd"] == ["/bin/sh"] and config["WorkingDir"] == "/app"
    # No setup container and no proxy process outlives the setup.
    assert docker_client.containers.list(all=True, filters={"name": "durafix-setup-"}) == []
    assert owned_pids("docker-setup/", prefix=True) == set()


def test_a_failing_networked_setup_command_leaves_no_image_and_no_container(
    docker_engine: DockerEngine, docker_client: docker.DockerClient, image_cache: Path, tmp_path: Path
) -> None:
    ws = _marked_workspace(tmp_path)
    recipe = _recipe(["touch first-step-ran", "echo failing on purpose; exit 3"])
    provider = _provider(tmp_path, docker_engine, image_cache)
    before = {image.id for image in docker_client.images.list(all=True)}
    log = tmp_path / "checks.log"
    try:
        with pytest.raises(SetupError, match=r"'echo failing on purpose; exit 3' exited 3") as failed:
            _run_checks(provider, recipe, ws, "fail", log, 120, 60)
        assert "failing on purpose" in str(failed.value)
        tag = provider.images.app_tag(recipe, ws, provider.images.base_tag(base_recipe(recipe)))
    finally:
        assert provider.cleanup_run(RUN).complete
        provider.close()
    assert tag.startswith(f"{APP_REPOSITORY}:")
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(tag)
    # The base image may be new (first build here); nothing else is: not the workspace image, not a commit.
    left = {image.id for image in docker_client.images.list(all=True)} - before
    with contextlib.suppress(docker.errors.ImageNotFound):
        left.discard(docker_client.images.get(provider.images.base_tag(base_recipe(recipe))).id)
    assert left == set()
    assert docker_client.containers.list(all=True, filters={"name": "durafix-setup-"}) == []
    assert "$ echo failing on purpose; exit 3\nfailing on purpose\n" in log.read_text()


def test_a_networked_setup_command_is_killed_at_the_setup_timeout(
    docker_engine: DockerEngine, docker_client: docker.DockerClient, image_cache: Path, tmp_path: Path
) -> None:
    ws = _marked_workspace(tmp_path)
    provider = _provider(tmp_path, docker_engine, image_cache)
    try:
        with pytest.raises(SetupStepError, match=r"'sleep 600' timed out"):
            provider.images.ensure_app(_recipe(["sleep 600"]), ws, setup_timeout_s=3)
    finally:
        provider.close()
    assert docker_client.containers.list(all=True, filters={"name": "durafix-setup-"}) == []


def test_a_networked_setup_replaces_a_dead_workers_setup_container_and_feeds_the_dependency_image(
    docker_engine: DockerEngine, docker_client: docker.DockerClient, image_cache: Path, tmp_path: Path
) -> None:
    setup = "mkdir -p .venv && cp requirements.txt .venv/installed && date +%s%N > .venv/when"
    recipe = _recipe([setup])
    first, second = tmp_path / "first", tmp_path / "second"
    # The same lock file in both trees, new to this engine (so the first tree's setup runs).
    lock = f"six==1.16.0\n# {uuid.uuid4().hex}\n"
    for ws, text in ((first, "the first tree"), (second, "the second tree")):
        ws.mkdir()
        (ws / "requirements.txt").write_text(lock)
        (ws / "tree.txt").write_text(text)
    provider = _provider(tmp_path, docker_engine, image_cache)
    images = provider.images
    try:
        # What app images are built on: the base image with the worker's CA layer.
        base = images.ensure_trust(base_recipe(recipe), images.ensure_base(base_recipe(recipe)))
        tag = images.app_tag(recipe, first, base)
        # What a worker that died mid-setup leaves: the tag's setup container, holding its name.
        stale = docker_client.containers.create(base, ["true"], name=setup_container_name(images.setup_key(tag)))
        assert images.ensure_app(recipe, first) == tag
        with pytest.raises(docker.errors.NotFound):
            stale.reload()
        deps = images.deps_tag(recipe, second, base)
        assert deps is not None and deps[1] == [".venv"]
        reusing: list[str] = []
        second_tag = images.ensure_app(recipe, second, progress=reusing.append)
    finally:
        provider.close()
    assert reusing[0].startswith("trust: reusing CA layer durafix/trust:"), reusing
    assert reusing[1:] == [f"setup: reusing .venv from image {deps[0]} (same lock files and setup)"]

    def run(image: str, command: str) -> str:
        return sh_in_image(docker_client, image, command, user="65534:65534")

    # The dependency image (the committed setup) under the second tree: its .venv, the second tree only.
    assert run(second_tag, "cat .venv/when") == run(tag, "cat .venv/when")
    assert run(second_tag, "cat tree.txt") == "the second tree"
    assert run(tag, "stat -c %U .venv/installed && pwd") == "nobody\n/app\n"


def test_the_registry_gives_the_docker_provider_the_workers_egress_hosts(
    docker_engine: DockerEngine, tmp_path: Path
) -> None:
    settings = SetupSettings(egress_hosts=("pypi.org", "files.pythonhosted.org"), egress_ports=(443, 8443))
    provider = get_provider("docker", tmp_path, docker_host=docker_engine.docker_host, setup=settings)
    assert isinstance(provider, DockerProvider)
    try:
        assert provider.images.egress_hosts == ("pypi.org", "files.pythonhosted.org")
        assert provider.images.egress_ports == (443, 8443)
    finally:
        provider.close()
