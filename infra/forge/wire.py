"""HTTP plumbing shared by the API and git front ends: requests, responses, errors, request bodies.

Request bodies are read fully before any handler runs (so a handler never sees half a body), from either a
``Content-Length`` or a ``Transfer-Encoding: chunked`` stream, decoded when ``Content-Encoding`` is gzip or
deflate (415 for any other coding), and refused with 413 past a size limit, which also bounds the decoded size.
Large bodies spill to a temporary file instead of memory, before and after decoding.
"""

from __future__ import annotations

import json
import tempfile
import zlib
from dataclasses import dataclass, field
from email.message import Message
from typing import IO, Any

DOCS_URL = "https://docs.github.com/rest"
SPOOL_IN_MEMORY = 8 * 1024 * 1024
CHUNK = 64 * 1024
# Content codings a request body may carry: git gzips its fetch requests; HTTP also names deflate.
DECODABLE = ("gzip", "x-gzip", "deflate")


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
    """The request body exceeds the route's limit, on the wire or once decoded; answered with 413."""


class UnsupportedEncoding(Exception):
    """The body carries a content coding the forge cannot decode; answered with 415 before the body is read."""

    def __init__(self, coding: str) -> None:
        super().__init__(f"unsupported Content-Encoding {coding!r}")
        self.coding = coding


class UndecodableBody(Exception):
    """The body does not decode under its declared content coding (corrupt or truncated); answered with 400."""


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
        chunk = src.read(min(remaining, CHUNK))
        if not chunk:
            raise ConnectionError("client closed the connection mid-body")
        total += len(chunk)
        if total > limit:
            raise BodyTooLarge
        dst.write(chunk)
        remaining -= len(chunk)
    return total


def content_codings(headers: Message) -> list[str]:
    """The body's content codings in the order they were applied (``identity`` dropped), all supported.

    Raises :class:`UnsupportedEncoding` for any other coding, so the caller can refuse before reading the body.
    """
    codings: list[str] = []
    for value in headers.get_all("Content-Encoding") or []:
        for item in str(value).split(","):
            coding = item.strip().lower()
            if not coding or coding == "identity":
                continue
            if coding not in DECODABLE:
                raise UnsupportedEncoding(coding)
            codings.append(coding)
    return codings


def _is_zlib_header(head: bytes) -> bool:
    """Whether ``head`` starts a zlib stream (RFC 1950): deflate method, window <= 32 KiB, valid check bits."""
    return len(head) >= 2 and head[0] & 0x0F == 8 and head[0] >> 4 <= 7 and ((head[0] << 8) | head[1]) % 31 == 0


def _inflate(src: IO[bytes], dst: IO[bytes], coding: str, limit: int) -> int:
    """Decode ``src`` into ``dst`` and return the decoded size; never more than ``limit`` bytes are produced.

    Output is pulled from zlib at most ``CHUNK`` bytes at a time (``max_length``), so a body that inflates
    to gigabytes costs one chunk of memory and stops at the limit. ``deflate`` is the zlib format (RFC 9110),
    but raw deflate is accepted too, since clients send both under that name. gzip may hold several members
    back to back (RFC 1952); each is decoded in turn.
    """
    gzipped = coding in ("gzip", "x-gzip")
    if gzipped:
        wbits = 16 + zlib.MAX_WBITS
    else:
        wbits = zlib.MAX_WBITS if _is_zlib_header(src.read(2)) else -zlib.MAX_WBITS
        src.seek(0)
    inflater = zlib.decompressobj(wbits)
    total = 0
    seen_input = False
    try:
        while data := src.read(CHUNK):
            seen_input = True
            while data:
                if inflater.eof:
                    if not gzipped:
                        raise UndecodableBody(f"data after the end of the {coding} stream")
                    # Zero padding after a member is tolerated, as Python's and GNU gzip do.
                    data = data.lstrip(b"\0")
                    if not data:
                        break
                    inflater = zlib.decompressobj(wbits)
                out = inflater.decompress(data, CHUNK)
                total += len(out)
                if total > limit:
                    raise BodyTooLarge
                dst.write(out)
                data = inflater.unused_data if inflater.eof else inflater.unconsumed_tail
    except zlib.error as exc:
        raise UndecodableBody(f"the body is not valid {coding}: {exc}") from exc
    if seen_input and not inflater.eof:
        raise UndecodableBody(f"the {coding} body ends before its stream does")
    return total


def _spooled() -> IO[bytes]:
    return tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)


def read_body(rfile: IO[bytes], headers: Message, limit: int) -> tuple[IO[bytes], int]:
    """Read the request body into a spooled file, positioned at its start, and return it with its size.

    Chunked framing is removed and the content codings of ``Content-Encoding`` (gzip, x-gzip, deflate; git
    gzips fetch requests over 1 KiB) are undone, so the caller sees the body the client meant. ``limit``
    applies to the bytes on the wire and again to the decoded bytes: :class:`BodyTooLarge` (a compression
    bomb included). An unknown coding raises :class:`UnsupportedEncoding` before any of the body is read; a
    corrupt one :class:`UndecodableBody`. Either way the body is left unread, so the connection must close.
    """
    codings = content_codings(headers)
    body = _spooled()
    try:
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
                total = _copy_limited(rfile, body, size, limit, total)
                rfile.readline(1024)
        else:
            length = int(headers.get("Content-Length") or 0)
            if length > limit:
                raise BodyTooLarge
            total = _copy_limited(rfile, body, length, limit, 0)
        # Codings are listed in the order they were applied, so they come off last first.
        for coding in reversed(codings):
            body.seek(0)
            decoded = _spooled()
            try:
                total = _inflate(body, decoded, coding, limit)
            except BaseException:
                decoded.close()
                raise
            body.close()
            body = decoded
    except BaseException:
        body.close()
        raise
    body.seek(0)
    return body, total
