"""HTTP plumbing shared by the API and git front ends: requests, responses, errors, request bodies.

Request bodies are read fully before any handler runs (so a handler never sees half a body), from either a
``Content-Length`` or a ``Transfer-Encoding: chunked`` stream, gunzipped when ``Content-Encoding: gzip``, and
refused with 413 past a size limit. Large bodies spill to a temporary file instead of memory.
"""

from __future__ import annotations

import gzip
import json
import tempfile
import zlib
from dataclasses import dataclass, field
from email.message import Message
from typing import IO, Any

DOCS_URL = "https://docs.github.com/rest"
SPOOL_IN_MEMORY = 8 * 1024 * 1024


class ApiError(Exception):
    """An error answered with GitHub's JSON error body: ``message``, ``documentation_url`` and maybe ``errors``."""

    def __init__(
        self,
        status: int,
        message: str,
        errors: list[Any] | None = None,
        headers: dict[str, str] | None = None,
        documentation_url: str = DOCS_URL,
    ) -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message
        self.errors = errors
        self.headers = headers or {}
        self.documentation_url = documentation_url

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"message": self.message}
        if self.errors is not None:
            out["errors"] = self.errors
        out["documentation_url"] = self.documentation_url
        out["status"] = str(self.status)
        return out


def not_found() -> ApiError:
    return ApiError(404, "Not Found")


def validation_failed(*errors: dict[str, Any]) -> ApiError:
    return ApiError(422, "Validation Failed", errors=list(errors))


def invalid_field(resource: str, field_name: str, code: str = "invalid") -> ApiError:
    return validation_failed({"resource": resource, "code": code, "field": field_name})


class BodyTooLarge(Exception):
    """The request body exceeds the route's limit; answered with 413."""


@dataclass
class Response:
    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def json(cls, status: int, data: Any, headers: list[tuple[str, str]] | None = None) -> Response:
        raw = json.dumps(data, separators=(",", ":")).encode()
        return cls(status, raw, [("Content-Type", "application/json; charset=utf-8"), *(headers or [])])

    @classmethod
    def empty(cls, status: int = 204) -> Response:
        return cls(status)


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Message
    body: IO[bytes]
    body_size: int
    client_ip: str

    def arg(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else None

    def raw_body(self) -> bytes:
        self.body.seek(0)
        return self.body.read()

    def json(self) -> Any:
        """The body as JSON; an empty body is ``{}``; anything unparsable is GitHub's 400."""
        raw = self.raw_body()
        if not raw.strip():
            return {}
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, "Problems parsing JSON") from exc

    def json_object(self) -> dict[str, Any]:
        data = self.json()
        if not isinstance(data, dict):
            raise ApiError(400, "Problems parsing JSON")
        return data


def _copy_limited(src: IO[bytes], dst: IO[bytes], length: int, limit: int, total: int) -> int:
    remaining = length
    while remaining > 0:
        chunk = src.read(min(remaining, 65536))
        if not chunk:
            raise ConnectionError("client closed the connection mid-body")
        total += len(chunk)
        if total > limit:
            raise BodyTooLarge
        dst.write(chunk)
        remaining -= len(chunk)
    return total


def read_body(rfile: IO[bytes], headers: Message, limit: int) -> tuple[IO[bytes], int]:
    """Read the request body into a spooled file; decode chunked framing and gzip/deflate encodings."""
    raw: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)  # noqa: SIM115 - handed to caller
    total = 0
    if "chunked" in (headers.get("Transfer-Encoding") or "").lower():
        while True:
            size_line = rfile.readline(1024)
            if not size_line:
                raise ConnectionError("client closed the connection mid-body")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                # Trailers end with an empty line.
                trailer = rfile.readline(1024)
                while trailer not in (b"\r\n", b"\n", b""):
                    trailer = rfile.readline(1024)
                break
            total = _copy_limited(rfile, raw, size, limit, total)
            rfile.readline(1024)
    else:
        length = int(headers.get("Content-Length") or 0)
        if length > limit:
            raise BodyTooLarge
        total = _copy_limited(rfile, raw, length, limit, 0)
    raw.seek(0)
    encoding = (headers.get("Content-Encoding") or "").lower()
    if encoding in ("gzip", "x-gzip", "deflate"):
        decoded: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)  # noqa: SIM115
        if encoding == "deflate":
            decoded.write(zlib.decompress(raw.read()))
        else:
            with gzip.GzipFile(fileobj=raw) as gz:
                total = 0
                while chunk := gz.read(65536):
                    total += len(chunk)
                    if total > limit:
                        raise BodyTooLarge
                    decoded.write(chunk)
        raw.close()
        total = decoded.tell()
        decoded.seek(0)
        return decoded, total
    return raw, total
