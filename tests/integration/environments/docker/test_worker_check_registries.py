"""``durafix worker --check`` on a Docker host: one real ``pip download`` in a setup container with the configured
trust, on the test session's engine, from PyPI; and a CA bundle setting that names no bundle.

The command runs as an operator runs it (the installed console script, in a child process, configured by its
environment). The check's base image is imported into the engine first from the shared root filesystem cache, as
the end-to-end tests warm theirs, so no debootstrap runs inside the command.
"""

from __future__ import annotations

import os
from pathlib import Path

import docker
import pytest

from environments.docker.images import ImageBuilder, base_recipe
from environments.docker.registry_reach import COMMAND, PACKAGES
from environments.interface import AppRecipe, ImageRecipe
from infra.docker.engine import DockerEngine
from tests.support.docker import registry_intercepted
from tests.support.durafix_cli import durafix

pytestmark = [pytest.mark.slow, pytest.mark.docker]


@pytest.fixture(scope="module")
def warmed(docker_client: docker.DockerClient, image_cache: Path) -> None:
    recipe = AppRecipe(setup=[COMMAND], setup_network=True, test="true", image=ImageRecipe(packages=PACKAGES))
    ImageBuilder(docker_client, image_cache).ensure_base(base_recipe(recipe))


def check(docker_engine: DockerEngine, tmp_path: Path, **settings: str) -> tuple[int, str]:
    """``durafix worker --check --queues environments`` on the engine, with ``settings`` as DURAFIX_ variables:
    its exit and the environments row of its table."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DURAFIX_", "OPENAI_"))}
    env |= {"DURAFIX_ENVIRONMENT_PROVIDER": "docker", "DURAFIX_DOCKER_HOST": docker_engine.docker_host}
    env |= {f"DURAFIX_{name.upper()}": value for name, value in settings.items()}
    args = ["--state-dir", str(tmp_path / "state"), "worker", "--check", "--queues", "environments"]
    result = durafix(args, env, timeout_s=600)
    [row] = [line for line in result.stdout.splitlines() if line.startswith("environments")]
    return result.returncode, row


def test_check_downloads_from_pypi_in_a_setup_container_with_the_worker_trust(
    docker_engine: DockerEngine, warmed: None, tmp_path: Path
) -> None:
    code, row = check(docker_engine, tmp_path)
    assert code == 0, row
    assert " found " in row and "CA bundle /etc/ssl/certs/ca-certificates.crt (sha256:" in row, row
    assert "pip download reached files.pythonhosted.org:443, pypi.org:443 from a setup container" in row, row
    log = (tmp_path / "state" / "environments" / "registry-check" / "registry-check.log").read_text()
    assert "Saved /tmp/durafix-check/six-" in log and "# trust: " in log, log


def test_a_ca_bundle_path_that_is_no_file_fails_the_check_naming_it(
    docker_engine: DockerEngine, warmed: None, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-ca.pem"
    code, row = check(docker_engine, tmp_path, ca_bundle=str(missing))
    assert code == 1, row
    assert " missing " in row and f"the CA bundle {missing} (DURAFIX_CA_BUNDLE) cannot be read" in row, row


def test_without_the_worker_ca_an_intercepted_registry_fails_the_check_naming_the_setting(
    docker_engine: DockerEngine, warmed: None, tmp_path: Path
) -> None:
    if not registry_intercepted():
        pytest.skip("this host reaches PyPI without a TLS-inspecting proxy: Debian's roots suffice here")
    code, row = check(docker_engine, tmp_path, ca_bundle="none")
    assert code == 1, row
    assert "an image build cannot install from the registries: setup command" in row, row
    assert "set the worker's `DURAFIX_CA_BUNDLE`" in row, row
