"""Open the configured artifact store from one URL.

- ``file:///abs/path`` -> :class:`LocalArtifactStore` at that directory;
- ``s3://bucket/optional/prefix?endpoint=http://host:port&region=us-east-1`` -> :class:`S3ArtifactStore`,
  with credentials from ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (and ``AWS_SESSION_TOKEN``) when
  set, else boto3's default chain.

``public_url`` is the base URL of the evidence server over the store, so ``url_for`` links resolve for a
reviewer's browser (and carry the server's headers: its Content-Security-Policy forbids framing); without
it a local store answers ``file://`` URLs and an S3 store presigned URLs, which S3 serves without any
Content-Security-Policy.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from evidence.interface import ArtifactStore
from evidence.links import LinkSigner
from evidence.local import LocalArtifactStore
from evidence.s3 import S3ArtifactStore, S3Credentials


def open_store(
    url: str,
    *,
    public_url: str | None = None,
    credentials: S3Credentials | None = None,
    link_secret: str | None = None,
) -> ArtifactStore:
    """The store ``url`` names. S3 ``credentials`` default to the environment's (see module docstring).
    ``link_secret``: the store's links to its evidence server are signed with it (:mod:`evidence.links`)."""
    parts = urlsplit(url)
    signer = LinkSigner(link_secret) if link_secret else None
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file URL must name a local path, got host {parts.netloc!r}: {url}")
        return LocalArtifactStore(Path(unquote(parts.path)), public_url=public_url, signer=signer)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ValueError(f"s3 URL names no bucket: {url}")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(query) - {"endpoint", "region"}
        if unknown:
            raise ValueError(f"unknown s3 URL parameters {sorted(unknown)} in {url}")
        return S3ArtifactStore(
            bucket=parts.netloc,
            prefix=unquote(parts.path),
            endpoint_url=query.get("endpoint"),
            region=query.get("region", "us-east-1"),
            credentials=credentials or credentials_from_env(),
            public_url=public_url,
            signer=signer,
        )
    raise ValueError(f"unsupported evidence store URL {url!r}: use file:///path or s3://bucket/prefix")


def credentials_from_env() -> S3Credentials | None:
    key_id = os.environ.get("AWS_ACCESS_KEY_ID")
    secret = os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not key_id or not secret:
        return None
    return S3Credentials(
        access_key_id=key_id, secret_access_key=secret, session_token=os.environ.get("AWS_SESSION_TOKEN") or None
    )
