"""`durafix evidence ...` through the real entry point, on the configured local store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from evidence.interface import ArtifactKind
from evidence.local import LocalArtifactStore

pytestmark = pytest.mark.slow  # each call starts the full CLI, seconds of imports

DURAFIX = str(Path(sys.executable).parent / "durafix")


def _env(state_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURAFIX_")}
    return {**env, "DURAFIX_STATE_DIR": str(state_dir)}


def test_gc_deletes_expired_kinds_from_the_configured_store(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "evidence")
    trace = store.put_bytes(b"trace", kind=ArtifactKind.TRACE, run_id="r")
    log = store.put_bytes(b"log", kind=ArtifactKind.LOG, run_id="r")
    done = subprocess.run(
        [DURAFIX, "evidence", "gc", "--keep", "trace=0", "--keep", "log=30"],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [trace.key]
    assert not store.exists(trace) and store.exists(log)


def test_gc_refuses_an_unknown_kind(tmp_path: Path) -> None:
    done = subprocess.run(
        [DURAFIX, "evidence", "gc", "--keep", "videos=3"], env=_env(tmp_path), capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "bad retention 'videos=3'" in done.stderr


def test_serve_defaults_to_the_configured_local_store(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "evidence")
    ref = store.put_bytes(b"served", kind=ArtifactKind.LOG, run_id="r")
    proc = subprocess.Popen(
        [DURAFIX, "evidence", "serve", "--port", "0"], env=_env(tmp_path), stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert httpx.get(f"{url}/a/{ref.key}", timeout=5).content == b"served"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
