"""A real Docker engine for the provider tests, started once per session and stopped at its end.

Each session starts its own engine (state in the session's temporary directory), so parallel sessions never
stop each other's engine. The image cache (the Debian root filesystem tarball) lives in
``$DURAFIX_DOCKER_IMAGE_CACHE`` (default ``~/.cache/durafix/docker-images``), so it is bootstrapped once and
later sessions only import it. With ``CI=true`` a missing or failing engine fails the tests with the reason;
elsewhere they are skipped with it.
"""

from __future__ import annotations

import os
import shutil
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import docker
import pytest
import yaml

from environments.docker import DockerProvider
from environments.docker.images import ImageBuilder
from environments.interface import AppRecipe, ImageRecipe, RecoverySpec
from infra.docker.engine import DockerEngine, EngineError
from tests.conftest import require, unavailable
from tests.support.chromium import chromium_path
from tests.support.e2e_stack import E2EStack, running_e2e_stack

REPO_ROOT = Path(__file__).resolve().parents[2]
CART = REPO_ROOT / "examples" / "cart"
_TOOLS = ("dockerd", "containerd", "runc", "debootstrap")


def _missing_prerequisite() -> str | None:
    if os.geteuid() != 0:
        return "dockerd and debootstrap need root"
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    return f"not installed: {', '.join(missing)}" if missing else None


def shared_image_cache() -> Path:
    """Where the tests keep root filesystem tarballs across sessions: ``$DURAFIX_DOCKER_IMAGE_CACHE``, by default
    ``~/.cache/durafix/docker-images``."""
    default = Path.home() / ".cache" / "durafix" / "docker-images"
    return Path(os.environ.get("DURAFIX_DOCKER_IMAGE_CACHE", default)).absolute()


@pytest.fixture(scope="session")
def image_cache() -> Path:
    return shared_image_cache()


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerEngine]:
    reason = _missing_prerequisite()
    if reason is not None:
        unavailable(reason)
    engine = DockerEngine(tmp_path_factory.mktemp("engine"))
    try:
        engine.ensure_running()
    except EngineError as exc:
        unavailable(str(exc))
    yield engine
    if engine.started_here:
        engine.stop()


@pytest.fixture(scope="session")
def docker_client(docker_engine: DockerEngine) -> Iterator[docker.DockerClient]:
    client = docker.DockerClient(base_url=docker_engine.docker_host, timeout=300)
    yield client
    client.close()


@pytest.fixture(scope="session")
def cart_recipe() -> AppRecipe:
    return AppRecipe.model_validate(yaml.safe_load((CART / "durafix.yaml").read_text()))


@pytest.fixture(scope="session")
def cart_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean copy of the sample app (no interpreter caches), shared so its app image is built once."""
    dest = tmp_path_factory.mktemp("cart") / "workspace"
    shutil.copytree(CART, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def make_spec(recipe: AppRecipe) -> RecoverySpec:
    return RecoverySpec(
        repository="example/cart",
        clone_url="https://forge.invalid/example/cart.git",
        base_revision="0" * 40,
        recipe=recipe,
    )


@pytest.fixture(scope="session")
def cart_spec(cart_recipe: AppRecipe) -> RecoverySpec:
    return make_spec(cart_recipe)


@pytest.fixture(scope="session")
def provider_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("provider")


@pytest.fixture
def provider(docker_engine: DockerEngine, provider_state: Path, image_cache: Path) -> Iterator[DockerProvider]:
    provider = DockerProvider(provider_state, docker_engine.docker_host, image_cache_dir=image_cache, stop_timeout_s=5)
    yield provider
    provider.close()


@pytest.fixture
def new_run(provider: DockerProvider) -> Iterator[Callable[[], str]]:
    """Fresh run IDs; every run handed out is cleaned up (and must clean up completely) after the test."""
    runs: list[str] = []

    def make() -> str:
        run_id = f"test-{uuid.uuid4().hex[:12]}"
        runs.append(run_id)
        return run_id

    yield make
    leftovers = [report for report in map(provider.cleanup_run, runs) if not report.complete]
    assert not leftovers, f"runs not cleaned up: {leftovers}"


def registry_intercepted() -> bool:
    """Whether this host reaches PyPI through a TLS-inspecting proxy: Debian's own roots do not verify it."""
    stock = b"".join(p.read_bytes() for p in sorted(Path("/usr/share/ca-certificates/mozilla").glob("*.crt")))
    context = ssl.create_default_context(cadata=stock.decode())
    try:
        urllib.request.urlopen("https://pypi.org/simple/six/", context=context, timeout=20).close()
    except urllib.error.URLError as exc:
        return isinstance(exc.reason, ssl.SSLCertVerificationError)
    return False


def warm_base_images(docker_host: str, images: Sequence[ImageRecipe]) -> None:
    """Import the base images of ``images`` into the engine from the shared tarball cache (bootstrapped there once
    if absent), so no activity's timeout is spent on debootstrap."""
    client = docker.DockerClient(base_url=docker_host, timeout=300)
    try:
        builder = ImageBuilder(client, shared_image_cache())
        for image in images:
            builder.ensure_base(image)
    finally:
        client.close()


@contextmanager
def docker_e2e_stack(
    tmp_path_factory: pytest.TempPathFactory, model_script: Callable[[Path], Path], images: Sequence[ImageRecipe]
) -> Iterator[E2EStack]:
    """The end-to-end stack with ``environments="docker"`` (its own engine under its state directory), answering
    from ``model_script(<state>/model-script.yaml)``, the base images of ``images`` imported before any run.
    Needs root, the engine's tools, git and Chromium (with ``CI=true`` their absence fails the test)."""
    require(os.geteuid() == 0, "the Docker engine needs root")
    missing = [tool for tool in ("dockerd", "containerd", "runc", "git") if shutil.which(tool) is None]
    require(not missing, f"not installed: {', '.join(missing)}")
    chromium_path()
    # Short on purpose: the engine's containerd socket path under this directory is limited to 104 bytes.
    state = tmp_path_factory.mktemp("dfx-docker")
    with running_e2e_stack(
        state,
        model_script=model_script(state / "model-script.yaml"),
        environments="docker",
        warm=lambda config: warm_base_images(config.docker_host, images),
    ) as e2e:
        yield e2e
