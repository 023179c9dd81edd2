"""Fixtures for the evidence store's tests: real S3 servers and one harness per store implementation.

``s3_server`` is a real SeaweedFS (session scope). Without the ``weed`` binary it skips, except with
``CI=true``, where it fails with the reason; a binary that is present but does not start always fails.
``moto_s3`` is moto's threaded S3 server, fast but permissive (it checks no signatures).
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from moto.server import ThreadedMotoServer

from evidence.interface import ArtifactRef, ArtifactStore
from evidence.local import LocalArtifactStore
from evidence.s3 import S3ArtifactStore, S3Credentials
from evidence.serve import EvidenceServer, make_server
from infra.processes import ServiceError
from infra.s3 import SeaweedS3, weed_binary
from tests.conftest import unavailable

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

MOTO_CREDENTIALS = S3Credentials(access_key_id="testing", secret_access_key="testing")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    try:
        weed_binary()
    except ServiceError as err:
        unavailable(str(err))
    server = SeaweedS3(tmp_path_factory.mktemp("seaweedfs"))
    try:
        server.start()
    except ServiceError as err:
        pytest.fail(f"SeaweedFS did not start: {err}")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[str]:
    """The endpoint URL of a moto S3 server on a free port."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@dataclass
class StoreCase:
    """One store under test plus ways to reach behind its back."""

    name: str
    store: ArtifactStore
    url: str
    env: dict[str, str]
    tamper: Callable[[ArtifactRef, bytes], None]
    conditional_create: Callable[[str, bytes], bool]
    object_keys: Callable[[], list[str]]
    raw_client: S3Client | None = None
    endpoint: str | None = None
    cleanup: list[Callable[[], None]] = field(default_factory=list)


def _local_case(root: Path) -> StoreCase:
    server: EvidenceServer = make_server(root)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    store = LocalArtifactStore(root, public_url=server.url)

    def tamper(ref: ArtifactRef, data: bytes) -> None:
        path = store.object_path(ref.key)
        path.chmod(0o644)
        path.write_bytes(data)

    def conditional_create(key: str, data: bytes) -> bool:
        tmp = root / "tmp" / f"raw-{uuid.uuid4().hex}"
        tmp.write_bytes(data)
        final = store.object_path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(tmp, final)
        except FileExistsError:
            return False
        finally:
            tmp.unlink()
        return True

    def object_keys() -> list[str]:
        return sorted(p.relative_to(root / "objects").as_posix() for p in (root / "objects").rglob("*") if p.is_file())

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return StoreCase(
        name="local",
        store=store,
        url=root.as_uri(),
        env={},
        tamper=tamper,
        conditional_create=conditional_create,
        object_keys=object_keys,
        cleanup=[stop],
    )


def _s3_case(name: str, endpoint: str, client: S3Client, credentials: S3Credentials) -> StoreCase:
    bucket = f"evidence-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    prefix = "runs/"
    store = S3ArtifactStore(bucket, prefix, endpoint_url=endpoint, credentials=credentials)

    def tamper(ref: ArtifactRef, data: bytes) -> None:
        client.put_object(Bucket=bucket, Key=prefix + ref.key, Body=data)

    def conditional_create(key: str, data: bytes) -> bool:
        try:
            client.put_object(Bucket=bucket, Key=prefix + key, Body=data, IfNoneMatch="*")
        except ClientError as err:
            if err.response["ResponseMetadata"]["HTTPStatusCode"] == 412:
                return False
            raise
        return True

    def object_keys() -> list[str]:
        listing = client.list_objects_v2(Bucket=bucket, Prefix=prefix)
        return sorted(item["Key"].removeprefix(prefix) for item in listing.get("Contents", []))

    return StoreCase(
        name=name,
        store=store,
        url=f"s3://{bucket}/{prefix}?endpoint={endpoint}",
        env={"AWS_ACCESS_KEY_ID": credentials.access_key_id, "AWS_SECRET_ACCESS_KEY": credentials.secret_access_key},
        tamper=tamper,
        conditional_create=conditional_create,
        object_keys=object_keys,
        raw_client=client,
        endpoint=endpoint,
    )


def moto_client(endpoint: str) -> S3Client:
    client: S3Client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=MOTO_CREDENTIALS.access_key_id,
        aws_secret_access_key=MOTO_CREDENTIALS.secret_access_key,
        region_name="us-east-1",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )
    return client


def _make_case(request: pytest.FixtureRequest, tmp_path: Path, kind: str) -> StoreCase:
    if kind == "local":
        return _local_case(tmp_path / "store")
    if kind == "moto":
        endpoint: str = request.getfixturevalue("moto_s3")
        return _s3_case("moto", endpoint, moto_client(endpoint), MOTO_CREDENTIALS)
    server: SeaweedS3 = request.getfixturevalue("s3_server")
    credentials = S3Credentials(access_key_id=server.access_key, secret_access_key=server.secret_key)
    return _s3_case("seaweedfs", server.endpoint_url, server.client(), credentials)


@pytest.fixture(params=["local", "moto", pytest.param("seaweedfs", marks=pytest.mark.s3)])
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreCase]:
    """Each store implementation in turn."""
    made = _make_case(request, tmp_path, request.param)
    yield made
    for stop in made.cleanup:
        stop()


@pytest.fixture(params=["moto", pytest.param("seaweedfs", marks=pytest.mark.s3)])
def s3_case(request: pytest.FixtureRequest, tmp_path: Path) -> StoreCase:
    """Each S3 server in turn."""
    return _make_case(request, tmp_path, request.param)
