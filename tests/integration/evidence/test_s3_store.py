"""S3-specific behaviour: multipart conditional create, changed files, and SeaweedFS's authentication."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from botocore.exceptions import ClientError

import evidence.s3
from evidence.interface import ArtifactKind
from evidence.s3 import ArtifactChangedError, S3ArtifactStore, S3Credentials
from evidence.streams import hash_file
from infra.s3 import SeaweedS3
from tests.support.evidence_stores import StoreCase, _make_case

MIB = 1024 * 1024


def _small_parts(case: StoreCase) -> S3ArtifactStore:
    """A second store on the same bucket that switches to multipart above 5 MiB."""
    store = case.store
    assert isinstance(store, S3ArtifactStore)
    return S3ArtifactStore(
        store.bucket,
        store.prefix,
        endpoint_url=case.endpoint,
        credentials=S3Credentials(
            access_key_id=case.env["AWS_ACCESS_KEY_ID"], secret_access_key=case.env["AWS_SECRET_ACCESS_KEY"]
        ),
        part_size=5 * MIB,
    )


def _pending_uploads(case: StoreCase) -> list[str]:
    store = case.store
    assert isinstance(store, S3ArtifactStore) and case.raw_client is not None
    listing = case.raw_client.list_multipart_uploads(Bucket=store.bucket)
    return [u["Key"] for u in listing.get("Uploads", [])]


def test_multipart_put_that_loses_the_race_returns_the_stored_object(
    s3_case: StoreCase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "trace.zip"
    src.write_bytes(os.urandom(12 * MIB))
    winner = _small_parts(s3_case).put_file(src, kind=ArtifactKind.TRACE, run_id="run-1")

    late = _small_parts(s3_case)
    # The late writer checked before the winner published: it uploads all parts, then its conditional
    # completion meets the winner's object.
    monkeypatch.setattr(late, "_stored_created_at", lambda key: None)
    loser = late.put_file(src, kind=ArtifactKind.TRACE, run_id="run-1")

    assert loser == winner
    assert s3_case.object_keys() == [winner.key]
    assert _pending_uploads(s3_case) == []
    assert s3_case.store.get_to_file(winner, tmp_path / "back.zip").read_bytes() == src.read_bytes()


@pytest.mark.parametrize("size", [1 * MIB, 12 * MIB], ids=["single-put", "multipart"])
def test_file_changed_while_stored_publishes_nothing(
    s3_case: StoreCase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    src = tmp_path / "log.txt"
    src.write_bytes(os.urandom(size))

    def hash_then_append(path: Path) -> tuple[str, int]:
        digest = hash_file(path)
        with path.open("ab") as f:
            f.write(b"late write")
        return digest

    monkeypatch.setattr(evidence.s3, "hash_file", hash_then_append)
    with pytest.raises(ArtifactChangedError):
        _small_parts(s3_case).put_file(src, kind=ArtifactKind.LOG, run_id="run-1")
    assert s3_case.object_keys() == []
    assert _pending_uploads(s3_case) == []


@pytest.fixture
def seaweedfs_case(request: pytest.FixtureRequest, tmp_path: Path) -> StoreCase:
    """The real S3 server only: moto reports a fixed, years-old ``Initiated`` for every multipart upload."""
    return _make_case(request, tmp_path, "seaweedfs")


@pytest.mark.s3
def test_retention_aborts_uploads_abandoned_by_a_killed_writer(seaweedfs_case: StoreCase) -> None:
    s3_case = seaweedfs_case
    store = s3_case.store
    client = s3_case.raw_client
    assert isinstance(store, S3ArtifactStore) and client is not None
    # What a writer killed between two parts leaves: an upload nobody will complete or abort.
    key = f"{store.prefix}trace/ab/{'ab' * 32}.zip"
    upload = client.create_multipart_upload(Bucket=store.bucket, Key=key)
    client.upload_part(Bucket=store.bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"x" * 1024)

    # A young upload may still be in progress somewhere: a retention pass leaves it alone.
    assert store.delete_expired(datetime.now(UTC), {ArtifactKind.TRACE: 30}) == []
    assert _pending_uploads(s3_case) == [key]
    # Once older than a day it was abandoned, and the pass aborts it.
    store.delete_expired(datetime.now(UTC) + timedelta(days=2), {})
    assert _pending_uploads(s3_case) == []
    assert s3_case.object_keys() == []


@pytest.mark.s3
def test_seaweedfs_refuses_a_request_signed_with_the_wrong_secret(s3_server: SeaweedS3) -> None:
    s3_server.create_bucket("signed-only")
    s3_server.client().put_object(Bucket="signed-only", Key="k", Body=b"v")
    with pytest.raises(ClientError) as refused:
        s3_server.client(secret_key="not-the-secret").get_object(Bucket="signed-only", Key="k")
    assert refused.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert s3_server.client().get_object(Bucket="signed-only", Key="k")["Body"].read() == b"v"


@pytest.mark.s3
def test_seaweedfs_refuses_an_unsigned_request(s3_server: SeaweedS3) -> None:
    s3_server.create_bucket("signed-only")
    s3_server.client().put_object(Bucket="signed-only", Key="k", Body=b"v")
    response = httpx.get(f"{s3_server.endpoint_url}/signed-only/k", timeout=10)
    assert response.status_code == 403
    assert b"AccessDenied" in response.content
