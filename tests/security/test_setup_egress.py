"""A hostile setup with ``setup_network: true`` against its egress proxy: it installs real packages from the
registries, and then tries the worker's own services through every door it has.

Real parts only: the local provider's ``run_checks`` (setup, then the tests) in bubblewrap, the egress proxy
it starts, the package registries (npm and PyPI), and listeners on the worker's ``127.0.0.1``, ``::1`` and its
non-loopback interface address standing in for the workflow server, the evidence server and a forge. The
hostile step asks the proxy for tunnels to each listener (by address, and by an allowed name that resolves to
loopback), to the cloud metadata address, and for a plain-HTTP forward, and connects straight to the loopback
listeners. The worker's non-loopback address and the metadata address are only ever asked of the proxy: this
test sends no packet anywhere but through it, and the proxy refuses them before connecting.

Asserted from outside: the packages are installed; every attempt failed; the listeners saw no connection; the
proxy's log, written into the setup's log, names only registry hosts as reached and every attempt as refused,
the metadata address without ever having been resolved or connected; the tests that follow have no way out
(no socket, no bridge); no proxy process outlives the setup.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from environments.checks import SetupSettings
from environments.egress import DEFAULT_REGISTRY_HOSTS, INSIDE_SOCKET, SOCAT
from environments.files import path_key
from environments.interface import AppRecipe, ReadinessProbe, RecoverySpec
from environments.local import LocalProcessProvider
from environments.processes import owned_pids
from environments.sandbox import Sandbox
from tests.conftest import require
from tests.support.listeners import EGRESS_ATTACK, Listener, listen, worker_address
from tests.support.sandbox import require_bubblewrap

pytestmark = pytest.mark.slow

RUN = "repair:acme/egress#3"

# The tests that follow setup: no proxy socket, no bridge, no network.
TESTS = (
    f"SOCKET = {INSIDE_SOCKET!r}\n"
    + r"""
import json, os, socket
seen = {"socket": os.path.exists(SOCKET), "proxy vars": sorted(k for k in os.environ if "proxy" in k.lower())}
try:
    socket.create_connection(("127.0.0.1", 3128), 5).close()
    seen["bridge"] = "reached"
except OSError as exc:
    seen["bridge"] = f"blocked: {exc}"
json.dump(seen, open("tests.json", "w"))
"""
)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    require_bubblewrap()
    require(Path(SOCAT).exists(), f"{SOCAT} is missing: setup's egress bridge needs it (apt-get install socat)")
    require(shutil.which("npm") is not None, "npm is not installed")
    return Sandbox.detect()


@pytest.fixture
def listeners() -> Iterator[dict[str, Listener]]:
    made = {"v4": listen("127.0.0.1"), "host": listen(worker_address())}
    # Without an IPv6 loopback on this worker there is nothing there to reach either.
    with contextlib.suppress(OSError):
        made["v6"] = listen("::1")
    yield made
    for listener in made.values():
        listener.sock.close()


def test_setup_reaches_the_registries_through_the_proxy_and_nothing_of_the_worker(
    sandbox: Sandbox, listeners: dict[str, Listener], tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "package.json").write_text(json.dumps({"name": "egress-probe", "version": "1.0.0", "private": True}))
    (ws / "attack.py").write_text(EGRESS_ATTACK)
    (ws / "tests.py").write_text(TESTS)
    v4, host = listeners["v4"], listeners["host"]
    tunnels = {
        "127.0.0.1": v4.authority,
        "localhost": f"localhost:{v4.port}",
        "host address": host.authority,
        "metadata:80": "169.254.169.254:80",
        "metadata:443": "169.254.169.254:443",
        **({"::1": listeners["v6"].authority} if "v6" in listeners else {}),
    }
    forwards = {"127.0.0.1": f"http://{v4.authority}/", "metadata": "http://169.254.169.254/latest/meta-data/"}
    direct = {"127.0.0.1": (v4.address, v4.port)}
    if "v6" in listeners:
        direct["::1"] = (listeners["v6"].address, listeners["v6"].port)
    targets = {"connect": tunnels, "get": forwards, "direct": direct}
    recipe = AppRecipe(
        setup=[
            "npm install --no-audit --no-fund --no-update-notifier is-number@7.0.0",
            # The worker's own pip configuration (local indexes) is not the registry's: ask the registry alone.
            "PIP_CONFIG_FILE=/dev/null python3 -m pip install --no-cache-dir --disable-pip-version-check "
            "--target .deps --index-url https://pypi.org/simple six==1.16.0",
            f"python3 attack.py '{json.dumps(targets)}'",
        ],
        setup_network=True,
        start="true",
        test="python3 tests.py",
        readiness=ReadinessProbe(path="/"),
    )
    # The listeners' ports are allowed, and "localhost" is an allowed name, so that what refuses those tunnels
    # is the check of the resolved address, not the port or name rules.
    settings = SetupSettings(
        package_caches=tmp_path / "packages",
        egress_hosts=(*DEFAULT_REGISTRY_HOSTS, "localhost"),
        egress_ports=(443, *(listener.port for listener in listeners.values())),
    )
    provider = LocalProcessProvider(tmp_path / "state", stop_grace_s=2.0, setup=settings, sandbox=sandbox)
    spec = RecoverySpec(repository="acme/egress", clone_url="x", base_revision="3f" * 20, recipe=recipe)
    log = tmp_path / "checks.log"
    result = provider.run_checks(
        spec, str(ws), run_id=RUN, op_id=f"{RUN}:checks", log_path=log, setup_timeout_s=300, test_timeout_s=60
    )
    text = log.read_text()
    assert result.passed, text

    # The registries were reached: real packages are installed.
    assert json.loads((ws / "node_modules" / "is-number" / "package.json").read_text())["version"] == "7.0.0"
    assert (ws / ".deps" / "six.py").is_file() and (ws / ".deps" / "six-1.16.0.dist-info").is_dir()

    # Every other attempt failed, and nothing of the worker saw a connection.
    attempts = json.loads((ws / "attempts.json").read_text())
    expected = {f"connect {name}" for name in tunnels} | {f"get {name}" for name in forwards}
    expected |= {"direct 127.0.0.1"} | ({"direct ::1"} if "v6" in listeners else set())
    assert set(attempts) == expected
    assert {name: verdict for name, verdict in attempts.items() if not verdict.startswith("blocked")} == {}
    time.sleep(0.5)  # a connection the proxy had made would have been accepted by now; none is expected
    assert {name: listener.seen for name, listener in listeners.items()} == {name: [] for name in listeners}

    # The proxy's log, as the setup's log has it: only registry hosts reached, every attempt refused.
    egress = [line.removeprefix("# egress: ") for line in text.splitlines() if line.startswith("# egress: ")]
    reached = {line.split()[1].rsplit(":", 1)[0] for line in egress if line.startswith("reached ")}
    assert reached and reached <= set(DEFAULT_REGISTRY_HOSTS), egress
    assert {"registry.npmjs.org", "pypi.org", "files.pythonhosted.org"} <= reached
    refused = [line for line in egress if line.startswith("refused ")]
    assert f"refused localhost:{v4.port} at 127.0.0.1: resolves to a loopback address" in refused
    for authority in (v4.authority, host.authority, "169.254.169.254:80", "169.254.169.254:443"):
        assert f"refused {authority}: not an allowed registry host" in refused, egress
    if "v6" in listeners:
        assert any(line.startswith("refused ") and f"::1]:{listeners['v6'].port}" in line for line in refused)
    assert f"refused {v4.authority}: only CONNECT tunnels are forwarded" in refused
    assert "refused 169.254.169.254:80: only CONNECT tunnels are forwarded" in refused
    # Never resolved, never connected: no refusal of the metadata address carries an address it went to.
    assert not [line for line in egress if line.startswith("reached ") and "169.254" in line]

    # The tests after it: no socket, no bridge, no proxy variables.
    seen = json.loads((ws / "tests.json").read_text())
    assert seen["socket"] is False and seen["proxy vars"] == [] and seen["bridge"].startswith("blocked")
    # No proxy process outlives the setup (they carry the setup's marker, under the run's key).
    assert owned_pids(f"{path_key(RUN)}/", prefix=True) == set()
