"""`durafix evidence ...` through the real entry point, on the configured store (local, or S3 on SeaweedFS)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from evidence.interface import ArtifactKind
from evidence.local import LocalArtifactStore
from evidence.s3 import S3ArtifactStore, S3Credentials
from infra.s3 import SeaweedS3

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


@pytest.mark.s3
def test_serve_fronts_a_configured_s3_store_with_the_headers_s3_cannot_send(
    tmp_path: Path, s3_server: SeaweedS3
) -> None:
    bucket = f"cli-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    store = S3ArtifactStore(
        bucket,
        "runs",
        endpoint_url=s3_server.endpoint_url,
        credentials=S3Credentials(access_key_id=s3_server.access_key, secret_access_key=s3_server.secret_key),
    )
    ref = store.put_bytes(b"<!doctype html><p>report", kind=ArtifactKind.REPORT, run_id="r", name="index.html")
    env = {
        **_env(tmp_path),
        "DURAFIX_EVIDENCE_URL": f"s3://{bucket}/runs?endpoint={s3_server.endpoint_url}",
        "AWS_ACCESS_KEY_ID": s3_server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
    }
    proc = subprocess.Popen([DURAFIX, "evidence", "serve", "--port", "0"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        response = httpx.get(f"{url}/a/{ref.key}", timeout=10)
        assert response.status_code == 200 and response.content == b"<!doctype html><p>report"
        assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
