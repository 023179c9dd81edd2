"""The artifact store on S3 (AWS or any S3 API that honours ``If-None-Match``), via boto3.

Objects live at ``<prefix><key>`` with user metadata ``sha256`` and ``created-at`` (first-stored time).

Conditional create, small and large alike. The key depends on the content's sha256, so a put first hashes
the file (one streaming pass), then asks whether the key exists (the idempotent fast path: a repeated put
uploads nothing). Otherwise:

- up to ``part_size`` bytes: one ``PutObject`` with ``If-None-Match: *``;
- larger: a multipart upload straight to the final key, one part in memory at a time, completed with
  ``CompleteMultipartUpload`` carrying ``If-None-Match: *``. S3 makes an object visible only when its
  multipart upload completes, and that completion is conditional, so large objects keep the same
  never-clobber guarantee without a temporary object and a copy. The upload pass hashes again; if the file
  changed between the passes the upload is aborted, so a key never holds bytes of another digest.

A 412 (PreconditionFailed) means another writer published the same key first; since the key names the
content, that is a success, and the put returns the stored object's ref. Every failure aborts the pending
multipart upload.

Links (``url_for``): presigned GET URLs, which S3 serves with the headers it stores and no others: S3 has no
way to send a Content-Security-Policy (so ``frame-ancestors``) with an object. With ``public_url`` (an
evidence server fronting this store, :mod:`evidence.serve`), links go to that server instead, which sends
them; ``keys`` and ``stored_meta`` are what it reads.

Retention counts from the object's LastModified. A repeated put refreshes it with a server-side copy onto
itself (metadata kept), and ``delete_expired`` re-reads LastModified just before deleting, which narrows
(but on S3 cannot close) the window in which a concurrent re-put of old content loses its object. It also
aborts multipart uploads under the prefix initiated more than a day before ``now``: a writer killed
mid-upload cannot abort its own, and S3 keeps (and bills) the parts of an unfinished upload forever.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
from pydantic import BaseModel

from evidence.interface import ArtifactError, ArtifactKind, ArtifactMissingError, ArtifactRef, ArtifactStore, PutRequest
from evidence.keys import media_type_for, object_key, parse_key, utc_iso
from evidence.links import LinkSigner
from evidence.streams import CHUNK, check_digest, hash_file, write_verified

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef, GetObjectOutputTypeDef, HeadObjectOutputTypeDef

DEFAULT_PART_SIZE = 8 * 1024 * 1024
# SigV4 presigned URLs cannot outlive a week.
MAX_PRESIGN_S = 7 * 24 * 3600
# An upload this old was abandoned: every live writer finishes or aborts its own long before.
STALE_UPLOAD = timedelta(days=1)


class S3Credentials(BaseModel):
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None


class ArtifactChangedError(ArtifactError):
    """The file changed while it was being stored; nothing was published."""


class S3ArtifactStore(ArtifactStore):
    """:class:`~evidence.interface.ArtifactStore` on an S3 bucket (see the module docstring).

    ``credentials`` None uses boto3's default chain. ``endpoint_url`` selects an S3-compatible server
    (path-style addressing, SigV4). ``public_url``: the base URL of an evidence server over this store, which
    ``url_for`` links then point to (signed with ``signer`` when given), instead of presigned S3 URLs.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        credentials: S3Credentials | None = None,
        *,
        part_size: int = DEFAULT_PART_SIZE,
        public_url: str | None = None,
        signer: LinkSigner | None = None,
    ) -> None:
        if part_size < 5 * 1024 * 1024:
            raise ValueError("S3 multipart parts must be at least 5 MiB")
        self.public_url = public_url.rstrip("/") if public_url else None
        self.signer = signer
        self.bucket = bucket
        self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self.part_size = part_size
        session = boto3.session.Session(
            aws_access_key_id=credentials.access_key_id if credentials else None,
            aws_secret_access_key=credentials.secret_access_key if credentials else None,
            aws_session_token=credentials.session_token if credentials else None,
            region_name=region,
        )
        config = Config(
            signature_version="s3v4",
            s3={"addressing_style": "path"} if endpoint_url else {},
            retries={"max_attempts": 4, "mode": "standard"},
            # The store verifies sha256 end to end itself; SDK default CRCs add nothing but incompatibility.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        self.client: S3Client = session.client("s3", endpoint_url=endpoint_url, config=config)

    # ---- writes ----------------------------------------------------------------------------------------

    def _store_file(self, path: Path, request: PutRequest) -> ArtifactRef:
        media = media_type_for(request.kind, request.name, request.media_type)
        sha256, size = hash_file(path)
        key = object_key(request.kind, sha256, media)
        created_at = self._stored_created_at(key)
        if created_at is None:
            if size <= self.part_size:
                data = path.read_bytes()
                if hashlib.sha256(data).hexdigest() != sha256:
                    raise ArtifactChangedError(f"{path} changed while it was being stored")
                created_at = self._create_small(key, data, sha256, media)
            else:
                created_at = self._create_multipart(key, path, sha256, media)
        return request.ref(key, sha256, size, media, created_at)

    def _store_bytes(self, data: bytes, request: PutRequest) -> ArtifactRef:
        media = media_type_for(request.kind, request.name, request.media_type)
        sha256 = hashlib.sha256(data).hexdigest()
        key = object_key(request.kind, sha256, media)
        created_at = self._stored_created_at(key)
        if created_at is None:
            created_at = self._create_small(key, data, sha256, media)
        return request.ref(key, sha256, len(data), media, created_at)

    def _stored_created_at(self, key: str) -> str | None:
        """The first-stored time of an existing object, after refreshing its retention clock; else None."""
        head = self._head(key)
        if head is None:
            return None
        metadata = head.get("Metadata", {})
        try:
            self.client.copy_object(
                Bucket=self.bucket,
                Key=self.prefix + key,
                CopySource={"Bucket": self.bucket, "Key": self.prefix + key},
                MetadataDirective="REPLACE",
                Metadata=metadata,
                ContentType=head.get("ContentType", "application/octet-stream"),
            )
        except ClientError as err:
            if _code(err) not in ("NoSuchKey", "404"):
                raise
            # Retention deleted it between the HEAD and the copy: store it again.
            return None
        return metadata.get("created-at") or utc_iso(head["LastModified"])

    def _create_small(self, key: str, data: bytes, sha256: str, media_type: str) -> str:
        created_at = utc_iso(datetime.now(UTC))
        try:
            self.client.put_object(
                Bucket=self.bucket,
                Key=self.prefix + key,
                Body=data,
                ContentType=media_type,
                Metadata={"sha256": sha256, "created-at": created_at},
                IfNoneMatch="*",
            )
        except ClientError as err:
            if not _precondition_failed(err):
                raise
            return self._winner_created_at(key, created_at)
        return created_at

    def _create_multipart(self, key: str, path: Path, sha256: str, media_type: str) -> str:
        created_at = utc_iso(datetime.now(UTC))
        full_key = self.prefix + key
        upload_id = self.client.create_multipart_upload(
            Bucket=self.bucket,
            Key=full_key,
            ContentType=media_type,
            Metadata={"sha256": sha256, "created-at": created_at},
        )["UploadId"]
        completed = False
        try:
            digest = hashlib.sha256()
            parts: list[CompletedPartTypeDef] = []
            with path.open("rb") as src:
                while chunk := src.read(self.part_size):
                    digest.update(chunk)
                    number = len(parts) + 1
                    etag = self.client.upload_part(
                        Bucket=self.bucket, Key=full_key, UploadId=upload_id, PartNumber=number, Body=chunk
                    )["ETag"]
                    parts.append({"ETag": etag, "PartNumber": number})
            if digest.hexdigest() != sha256:
                raise ArtifactChangedError(f"{path} changed while it was being stored")
            try:
                self.client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=full_key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                    IfNoneMatch="*",
                )
                completed = True
            except ClientError as err:
                if not _precondition_failed(err):
                    raise
                return self._winner_created_at(key, created_at)
        finally:
            if not completed:
                self._abort(full_key, upload_id)
        return created_at

    def _winner_created_at(self, key: str, fallback: str) -> str:
        head = self._head(key)
        if head is None:
            return fallback
        created: str = head.get("Metadata", {}).get("created-at") or utc_iso(head["LastModified"])
        return created

    def _abort(self, full_key: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=full_key, UploadId=upload_id)
        except ClientError as err:
            if _code(err) != "NoSuchUpload":
                raise

    # ---- reads -----------------------------------------------------------------------------------------

    def get_to_file(self, ref: ArtifactRef, dest: Path) -> Path:
        return write_verified(ref, self._chunks(ref), dest)

    def read_bytes(self, ref: ArtifactRef) -> bytes:
        data = self._get(ref)["Body"].read()
        check_digest(ref, hashlib.sha256(data).hexdigest(), len(data))
        return data

    def exists(self, ref: ArtifactRef) -> bool:
        return self._head(ref.key) is not None

    def url_for(self, ref: ArtifactRef, expires_s: int = MAX_PRESIGN_S) -> str:
        """The evidence server's URL when ``public_url`` is set (signed with ``signer`` when there is one), else
        a presigned GET URL, valid for ``expires_s`` (capped at the SigV4 maximum of 7 days)."""
        if self.public_url:
            path = f"/a/{ref.key}"
            return f"{self.public_url}{self.signer.sign(path) if self.signer else path}"
        url: str = self.client.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.bucket, "Key": self.prefix + ref.key},
            ExpiresIn=min(expires_s, MAX_PRESIGN_S),
        )
        return url

    # ---- what the evidence server needs ----------------------------------------------------------------

    def stored_meta(self, key: str) -> dict[str, object] | None:
        """``media_type``, ``size`` and ``created_at`` of the object ``key`` as stored (None: there is none);
        ValueError for a malformed key, so no request names an object outside the store's own keys."""
        parse_key(key)
        head = self._head(key)
        if head is None:
            return None
        return {
            "media_type": head.get("ContentType", "application/octet-stream"),
            "size": head["ContentLength"],
            "created_at": head.get("Metadata", {}).get("created-at") or utc_iso(head["LastModified"]),
        }

    def keys(self, kind: ArtifactKind) -> Iterator[str]:
        """The keys of the stored artifacts of ``kind`` (objects under the prefix of another shape skipped)."""
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{self.prefix}{kind.value}/"
        ):
            for item in page.get("Contents", []):
                key = item["Key"].removeprefix(self.prefix)
                try:
                    parse_key(key)
                except ValueError:
                    continue
                yield key

    # ---- retention -------------------------------------------------------------------------------------

    def delete_expired(self, now: datetime, retention: dict[ArtifactKind, float]) -> list[str]:
        deleted: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for kind, days in retention.items():
            cutoff = now - timedelta(days=days)
            for page in paginator.paginate(Bucket=self.bucket, Prefix=f"{self.prefix}{kind.value}/"):
                for item in page.get("Contents", []):
                    if item["LastModified"] >= cutoff:
                        continue
                    key = item["Key"].removeprefix(self.prefix)
                    head = self._head(key)
                    if head is None or head["LastModified"] >= cutoff:
                        continue
                    self.client.delete_object(Bucket=self.bucket, Key=item["Key"])
                    deleted.append(key)
        self.abort_stale_uploads(now - STALE_UPLOAD)
        return deleted

    def abort_stale_uploads(self, initiated_before: datetime) -> list[str]:
        """Abort the multipart uploads under the prefix initiated before ``initiated_before``; their keys."""
        aborted: list[str] = []
        for page in self.client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self.bucket, Prefix=self.prefix
        ):
            for upload in page.get("Uploads", []):
                if upload["Initiated"] < initiated_before:
                    self._abort(upload["Key"], upload["UploadId"])
                    aborted.append(upload["Key"].removeprefix(self.prefix))
        return aborted

    # ---- helpers ---------------------------------------------------------------------------------------

    def _head(self, key: str) -> HeadObjectOutputTypeDef | None:
        try:
            return self.client.head_object(Bucket=self.bucket, Key=self.prefix + key)
        except ClientError as err:
            if _code(err) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def _chunks(self, ref: ArtifactRef) -> Iterator[bytes]:
        yield from self._get(ref)["Body"].iter_chunks(CHUNK)

    def _get(self, ref: ArtifactRef) -> GetObjectOutputTypeDef:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self.prefix + ref.key)
        except ClientError as err:
            if _code(err) in ("404", "NoSuchKey", "NotFound"):
                raise ArtifactMissingError(f"no artifact {ref.key} in s3://{self.bucket}/{self.prefix}") from err
            raise


def _code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def _precondition_failed(err: ClientError) -> bool:
    status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status == 412 or _code(err) == "PreconditionFailed"
