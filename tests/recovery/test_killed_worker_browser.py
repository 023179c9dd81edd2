"""A worker killed with its browser leaves nothing of Playwright's outside its temporary root, and the root goes.

Playwright's driver makes a profile, an artifacts and a traces folder for each launch and removes them only when it
ends normally; a worker's whole process group SIGKILLed (the driver with it) used to leave them in the operator's
temporary directory. A worker process now keeps them in its own root (:mod:`browser.driver_temp`), which whoever
outlives it removes (:mod:`pipeline.worker.tmp_root`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from browser.driver_temp import NODE_ENV, ORIGINAL_ENV, SCRIPT, keep_driver_temporaries_in, release_driver_temporaries
from pipeline.worker import tmp_root
from tests.support.browser_apps import CART_DIR, serve_cart
from tests.support.chromium import chromium_path
from tests.support.proctree import wait_dead
from tests.support.tmp_dirs import passable_tmp

pytestmark = [pytest.mark.browser]

# A worker process as far as the browser goes: its temporary root first, then one reproduction of the cart's
# report in the kept browser, which stays open (its driver and Chromium alive) until the process is killed.
WORKER = """
import sys, time
from pathlib import Path
from browser.procedure import parse_procedure
from browser.runner import BrowserRunner
from pipeline.worker import tmp_root

base, chromium, url, cart = sys.argv[1:5]
root = tmp_root.start(Path(base))
runner = BrowserRunner(executable_path=chromium)
procedure = parse_procedure((Path(cart) / "repro.yaml").read_text()).model_copy(update={"runs": 1})
result = runner.run(procedure, url, root.path / "out")
print(result.status.value, flush=True)
time.sleep(600)
"""

PLAYWRIGHT_FOLDERS = ("playwright_chromiumdev_profile-", "playwright-artifacts-", "playwright-tracing-")


def playwright_folders(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(PLAYWRIGHT_FOLDERS))


@pytest.fixture
def base() -> Iterator[Path]:
    """The worker's ``TMPDIR``, where nothing else makes files."""
    with passable_tmp("killed-worker-tmp-") as folder:
        yield folder


def test_a_worker_killed_with_its_browser_leaves_playwrights_folders_only_in_its_root_which_is_removed(
    base: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in (NODE_ENV, ORIGINAL_ENV)} | {"TMPDIR": str(base)}
    with serve_cart() as url:
        worker = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(base), chromium_path(), url, str(CART_DIR)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "reproduced"
            (root,) = tmp_root.roots(base)
            # The driver made its folders for the launch (a profile, artifacts) in the worker's root, none beside.
            made = playwright_folders(root.path)
            assert all(any(name.startswith(kind) for name in made) for kind in PLAYWRIGHT_FOLDERS[:2]), made
            assert playwright_folders(base) == []
        finally:
            os.killpg(worker.pid, signal.SIGKILL)  # the worker, its driver and Chromium at once
            worker.wait()
    wait_dead(worker.pid)
    assert playwright_folders(base) == [] and [p.name for p in base.iterdir()] == [root.path.name]
    assert tmp_root.sweep(base) == [root.path]
    assert list(base.iterdir()) == []


def test_the_driver_setting_is_the_processs_own_and_released_with_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(NODE_ENV, "/opt/node/bin/node")  # an operator's own Node.js
    monkeypatch.delenv(ORIGINAL_ENV, raising=False)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    keep_driver_temporaries_in(first)
    # A child process calling it again (it inherits both variables) runs the operator's Node.js, not the parent's
    # script, and keeps its own folder.
    script = keep_driver_temporaries_in(second)
    assert os.environ[NODE_ENV] == str(second / SCRIPT) == str(script)
    text = script.read_text()
    assert f"TMPDIR={second}\n" in text and 'exec /opt/node/bin/node "$@"' in text
    release_driver_temporaries(first)  # not the one in force: nothing changes
    assert os.environ[NODE_ENV] == str(script)
    release_driver_temporaries(second)
    assert os.environ[NODE_ENV] == "/opt/node/bin/node" and ORIGINAL_ENV not in os.environ


def test_the_script_runs_node_with_the_folder_as_its_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(NODE_ENV, raising=False)
    monkeypatch.delenv(ORIGINAL_ENV, raising=False)
    script = keep_driver_temporaries_in(tmp_path)
    printed = subprocess.run(
        [str(script), "-e", "console.log(require('os').tmpdir())"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert printed == str(tmp_path)
    release_driver_temporaries(tmp_path)
    assert NODE_ENV not in os.environ
