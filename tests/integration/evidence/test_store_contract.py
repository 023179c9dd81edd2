"""The ArtifactStore contract, proved on every implementation: local disk, S3 on moto, S3 on SeaweedFS."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from evidence.interface import ArtifactKind, ArtifactMissingError, ArtifactRef, IntegrityError
from evidence.keys import object_key
from evidence.streams import hash_file
from tests.support.evidence_stores import StoreCase

MIB = 1024 * 1024


def test_put_and_get_round_trip_bytes_and_files(case: StoreCase, tmp_path: Path) -> None:
    store = case.store
    data = b"Total: $23.75 but the lines add up to $40.00\n"
    ref = store.put_bytes(data, kind=ArtifactKind.LOG, run_id="run-1", name="console.log", revision="abc123")
    sha = hashlib.sha256(data).hexdigest()
    assert (ref.sha256, ref.size, ref.kind, ref.media_type) == (sha, len(data), ArtifactKind.LOG, "text/plain")
    assert ref.key == f"log/{sha[:2]}/{sha}.txt"
    assert (ref.name, ref.run_id, ref.revision) == ("console.log", "run-1", "abc123")
    assert store.read_bytes(ref) == data
    assert store.exists(ref)

    src = tmp_path / "shot.png"
    src.write_bytes(os.urandom(3 * MIB + 17))
    file_ref = store.put_file(src, kind=ArtifactKind.SCREENSHOT, run_id="run-1")
    assert file_ref.name == "shot.png" and file_ref.media_type == "image/png"
    out = store.get_to_file(file_ref, tmp_path / "out" / "copy.png")
    assert out.read_bytes() == src.read_bytes()


def test_second_put_of_same_content_returns_the_same_ref_and_stores_one_object(case: StoreCase) -> None:
    first = case.store.put_bytes(b"same bytes", kind=ArtifactKind.PATCH, run_id="run-1", name="fix.diff")
    time.sleep(1.1)  # created_at has second resolution: a fresh timestamp would differ now
    second = case.store.put_bytes(b"same bytes", kind=ArtifactKind.PATCH, run_id="run-1", name="fix.diff")
    assert second == first
    assert case.object_keys() == [first.key]


def test_concurrent_puts_of_same_content_all_succeed_with_one_object(case: StoreCase, tmp_path: Path) -> None:
    src = tmp_path / "trace.zip"
    src.write_bytes(os.urandom(MIB))
    barrier = threading.Barrier(6)
    refs: list[ArtifactRef] = []
    errors: list[BaseException] = []

    def put() -> None:
        barrier.wait()
        try:
            refs.append(case.store.put_file(src, kind=ArtifactKind.TRACE, run_id="run-1"))
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=put) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len({r.key for r in refs}) == 1 and len({r.created_at for r in refs}) == 1
    assert case.object_keys() == [refs[0].key]
    assert case.store.read_bytes(refs[0]) == src.read_bytes()


def test_storage_refuses_a_second_conditional_create_of_a_key(case: StoreCase) -> None:
    data = b"first writer"
    key = object_key(ArtifactKind.OTHER, hashlib.sha256(data).hexdigest(), "application/octet-stream")
    assert case.conditional_create(key, data) is True
    assert case.conditional_create(key, b"second writer") is False
    ref = case.store.put_bytes(data, kind=ArtifactKind.OTHER, run_id="run-1")
    assert ref.key == key
    assert case.store.read_bytes(ref) == data


def test_tampered_object_is_detected_on_read(case: StoreCase, tmp_path: Path) -> None:
    ref = case.store.put_bytes(b"diff --git a/cart.py b/cart.py\n", kind=ArtifactKind.PATCH, run_id="run-1")
    case.tamper(ref, b"diff --git a/cart.py b/cart.py\n+import os; os.system('evil')\n")
    with pytest.raises(IntegrityError):
        case.store.read_bytes(ref)
    downloads = tmp_path / "downloads"
    with pytest.raises(IntegrityError):
        case.store.get_to_file(ref, downloads / "patch.diff")
    assert list(downloads.iterdir()) == []


def test_reading_an_absent_artifact_raises_missing(case: StoreCase) -> None:
    ref = case.store.put_bytes(b"kept elsewhere", kind=ArtifactKind.LOG, run_id="run-1")
    absent = ref.model_copy(update={"key": object_key(ArtifactKind.LOG, "0" * 64, "text/plain"), "sha256": "0" * 64})
    assert not case.store.exists(absent)
    with pytest.raises(ArtifactMissingError):
        case.store.read_bytes(absent)


def test_url_for_serves_the_artifact_over_http(case: StoreCase) -> None:
    data = b"<html><body>report</body></html>"
    ref = case.store.put_bytes(data, kind=ArtifactKind.REPORT, run_id="run-1", name="index.html")
    response = httpx.get(case.store.url_for(ref, expires_s=300), timeout=10)
    assert response.status_code == 200
    assert response.content == data
    assert response.headers["content-type"].startswith("text/html")


def test_retention_deletes_only_expired_kinds(case: StoreCase) -> None:
    trace = case.store.put_bytes(b"trace", kind=ArtifactKind.TRACE, run_id="run-1")
    log = case.store.put_bytes(b"log", kind=ArtifactKind.LOG, run_id="run-1")
    shot = case.store.put_bytes(b"png", kind=ArtifactKind.SCREENSHOT, run_id="run-1")
    policy = {ArtifactKind.TRACE: 30.0, ArtifactKind.SCREENSHOT: 60.0}
    now = datetime.now(UTC)

    assert case.store.delete_expired(now + timedelta(days=10), policy) == []
    assert case.store.delete_expired(now + timedelta(days=40), policy) == [trace.key]
    assert not case.store.exists(trace)
    assert case.store.exists(log) and case.store.exists(shot)
    assert case.object_keys() == sorted([log.key, shot.key])


_MEMORY_PROBE = """
import json, sys
from pathlib import Path
from evidence.interface import ArtifactKind
from evidence.open import open_store

def peak_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

store = open_store(sys.argv[1])
warm = store.put_bytes(b"warm up imports and connections", kind=ArtifactKind.LOG, run_id="mem")
store.get_to_file(warm, Path(sys.argv[3] + ".warm"))
before = peak_kb()
ref = store.put_file(Path(sys.argv[2]), kind=ArtifactKind.TRACE, run_id="mem")
store.get_to_file(ref, Path(sys.argv[3]))
print(json.dumps({"growth_kb": peak_kb() - before, "sha256": ref.sha256}))
"""


@pytest.mark.slow
def test_100_mb_artifact_is_streamed_with_bounded_memory(case: StoreCase, tmp_path: Path) -> None:
    src = tmp_path / "big-trace.zip"
    with src.open("wb") as out:
        for _ in range(100):
            out.write(os.urandom(MIB))
    sha, _ = hash_file(src)
    dest = tmp_path / "back.zip"
    proc = subprocess.run(
        [sys.executable, "-c", _MEMORY_PROBE, case.url, str(src), str(dest)],
        env={**os.environ, **case.env},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["sha256"] == sha
    assert hash_file(dest) == (sha, 100 * MIB)
    # The whole artifact is 100 MiB; a streaming put + get holds a part or a chunk at a time.
    assert result["growth_kb"] < 40 * 1024, f"peak RSS grew by {result['growth_kb']} KiB"
