"""open_store: one URL selects and configures the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from evidence.interface import ArtifactKind
from evidence.local import LocalArtifactStore
from evidence.open import open_store
from evidence.s3 import S3ArtifactStore
from tests.support.evidence_stores import MOTO_CREDENTIALS, moto_client


def test_file_url_opens_a_local_store_that_links_through_the_evidence_server(tmp_path: Path) -> None:
    store = open_store((tmp_path / "ev dir").as_uri(), public_url="http://127.0.0.1:9999/")
    assert isinstance(store, LocalArtifactStore)
    assert store.root == (tmp_path / "ev dir").resolve()
    ref = store.put_bytes(b"x", kind=ArtifactKind.LOG, run_id="r")
    assert store.url_for(ref) == f"http://127.0.0.1:9999/a/{ref.key}"


def test_s3_url_with_env_credentials_stores_under_the_prefix(moto_s3: str, monkeypatch: pytest.MonkeyPatch) -> None:
    moto_client(moto_s3).create_bucket(Bucket="open-store")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", MOTO_CREDENTIALS.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", MOTO_CREDENTIALS.secret_access_key)
    store = open_store(f"s3://open-store/team/evidence?endpoint={moto_s3}&region=eu-west-1")
    assert isinstance(store, S3ArtifactStore)
    ref = store.put_bytes(b"hello", kind=ArtifactKind.LOG, run_id="r")
    listing = moto_client(moto_s3).list_objects_v2(Bucket="open-store")
    assert [o["Key"] for o in listing["Contents"]] == [f"team/evidence/{ref.key}"]
    assert store.read_bytes(ref) == b"hello"


@pytest.mark.parametrize(
    "url",
    ["http://example.invalid/evidence", "s3:///no-bucket", "s3://b/p?endpoint=http://x&colour=red", "file://host/p"],
)
def test_unusable_urls_are_refused_with_the_reason(url: str) -> None:
    with pytest.raises(ValueError):
        open_store(url)
