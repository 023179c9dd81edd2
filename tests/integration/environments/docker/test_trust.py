"""The worker's CA bundle as a layer of the Docker provider's images, on a real engine and a real registry.

A bundle of the test's own (the worker's system bundle plus a throwaway CA, so its digest is new to the engine)
is added to a networked recipe's base image; setup downloads a real package from PyPI through the egress proxy
(on a host behind a TLS-inspecting proxy this needs the worker's CA), and the tests' container reports what it
trusts. A second build of another tree reuses the layer, and the build log says so each time.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from environments.ca_bundle import CA_VARIABLES, SYSTEM_BUNDLE, CABundle, CABundleError
from environments.checks import SetupError
from environments.docker import DockerProvider
from environments.docker.trust import IMAGE_CA_FILE
from environments.egress import PROXY_ENV
from environments.interface import AppRecipe, ImageRecipe, ReadinessProbe, RecoverySpec, TestRunResult
from environments.passthrough import DEFAULT_PATTERNS
from infra.docker.engine import DockerEngine
from tests.support.docker import registry_intercepted
from tests.support.throwaway_ca import ThrowawayCA

pytestmark = [pytest.mark.slow, pytest.mark.docker]

RUN = "repair:acme/docker-trust#3"
# The security test's packages: its root filesystem is usually cached already.
PACKAGES = ["python3", "python3-pip"]
DOWNLOAD = "python3 -m pip download --no-deps --no-cache-dir -d downloads six==1.16.0"
# What setup saw of the worker's variables, kept in the image for the tests' container to report.
PASSED = 'echo "$PIP_DEFAULT_TIMEOUT|$SSL_CERT_FILE|$HTTPS_PROXY" > passed.txt'
REPORT = "== durafix-trust: "
TESTS = (
    "import json, os\n"
    f"ca = open({IMAGE_CA_FILE!r}).read()\n"
    f"bundle = open({SYSTEM_BUNDLE!r}).read()\n"
    f"names = {sorted(CA_VARIABLES)!r}\n"
    "print(" + repr(REPORT) + " + json.dumps({'downloads': sorted(os.listdir('downloads')),"
    " 'layer': ca, 'in_bundle': ca.strip() in bundle, 'passed': open('passed.txt').read().strip(),"
    " 'env': {n: os.environ.get(n) for n in names}}))\n"
)


def _recipe(setup: list[str]) -> AppRecipe:
    return AppRecipe(
        setup=setup,
        setup_network=True,
        start="true",
        test="python3 report.py",
        readiness=ReadinessProbe(path="/"),
        image=ImageRecipe(packages=PACKAGES),
    )


def _checks(provider: DockerProvider, recipe: AppRecipe, tmp_path: Path, step: str) -> tuple[TestRunResult, str]:
    ws = tmp_path / step
    ws.mkdir()
    (ws / "report.py").write_text(TESTS)
    (ws / "marker.txt").write_text(uuid.uuid4().hex)  # a tree new to the engine: its app image is built
    log = tmp_path / f"{step}.log"
    spec = RecoverySpec(repository="acme/docker-trust", clone_url="x", base_revision="3c" * 20, recipe=recipe)
    result = provider.run_checks(
        spec,
        str(ws),
        run_id=RUN,
        op_id=f"{RUN}:{step}",
        log_path=log,
        setup_timeout_s=300,
        test_timeout_s=60,
    )
    return result, log.read_text()


def test_the_worker_bundle_is_a_cached_layer_that_setup_and_tests_trust(
    docker_engine: DockerEngine, image_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The operator's package-manager setting reaches setup; the worker's proxy and bundle paths do not (they
    # name the worker's places): setup goes through the egress proxy and trusts the image's bundle.
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "61")
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "worker-only.pem"))
    monkeypatch.setenv("HTTPS_PROXY", "http://worker-proxy.invalid:3128")
    ca = ThrowawayCA(tmp_path / "ca", name=f"durafix trust test {uuid.uuid4().hex[:8]}")
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(Path(SYSTEM_BUNDLE).read_bytes() + ca.cert.read_bytes())
    digest = CABundle.read(bundle).short()
    provider = DockerProvider(
        tmp_path / "state",
        docker_engine.docker_host,
        image_cache_dir=image_cache,
        ca_bundle=bundle,
        passthrough=DEFAULT_PATTERNS,
    )
    try:
        first, first_log = _checks(provider, _recipe([DOWNLOAD, PASSED]), tmp_path, "first")
        second, second_log = _checks(provider, _recipe([DOWNLOAD, PASSED]), tmp_path, "second")
    finally:
        provider.close()
    assert f"# trust: adding CA bundle {bundle} ({digest}) as layer durafix/trust:" in first_log, first_log
    assert "# trust: reusing CA layer durafix/trust:" in second_log and digest in second_log, second_log
    assert "# egress: reached pypi.org:443" in first_log, first_log
    for result, log in ((first, first_log), (second, second_log)):
        assert result.exit_code == 0, log
        seen = json.loads(next(line for line in log.splitlines() if line.startswith(REPORT)).removeprefix(REPORT))
        assert seen["downloads"] == ["six-1.16.0-py2.py3-none-any.whl"]
        # The worker's bundle, the throwaway CA included, folded into the image's own bundle the Debian way.
        assert seen["layer"].strip() == bundle.read_text().strip()
        assert seen["in_bundle"] is True
        # Every bundle variable points at the image's paths, never at the test's bundle on the worker.
        assert seen["env"] == CA_VARIABLES
        assert seen["passed"] == f"61|{CA_VARIABLES['SSL_CERT_FILE']}|{PROXY_ENV['HTTPS_PROXY']}"
        [passed] = [line for line in log.splitlines() if line.startswith("# worker variables passed to setup: ")]
        assert "PIP_DEFAULT_TIMEOUT" in passed.split(": ", 1)[1].split(", ")
        assert "SSL_CERT_FILE" not in passed and "HTTPS_PROXY" not in passed, passed


def test_without_the_worker_bundle_an_intercepted_registry_is_refused(
    docker_engine: DockerEngine, image_cache: Path, tmp_path: Path
) -> None:
    if not registry_intercepted():
        pytest.skip("this host reaches PyPI without a TLS-inspecting proxy: Debian's roots suffice here")
    provider = DockerProvider(
        tmp_path / "state", docker_engine.docker_host, image_cache_dir=image_cache, ca_bundle=None
    )
    try:
        with pytest.raises(SetupError) as raised:
            _checks(provider, _recipe([f"{DOWNLOAD} --retries 0"]), tmp_path, "untrusted")
    finally:
        provider.close()
    assert "CERTIFICATE_VERIFY_FAILED" in str(raised.value)


def test_a_bundle_path_that_is_not_a_bundle_is_named(
    docker_engine: DockerEngine, image_cache: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-bundle.pem"
    provider = DockerProvider(
        tmp_path / "state", docker_engine.docker_host, image_cache_dir=image_cache, ca_bundle=missing
    )
    try:
        with pytest.raises(CABundleError, match=f"the CA bundle {missing} \\(DURAFIX_CA_BUNDLE\\) cannot be read"):
            _checks(provider, _recipe(["true"]), tmp_path, "missing")
    finally:
        provider.close()
