"""Request bodies: chunked framing and content codings are undone before a handler runs, within the size limit.

The reader is driven directly (a byte stream plus headers) for the decoding cases, and through the running
forge over HTTP for the answers a client sees (201, 413, 415, 400).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import zlib
from email.message import Message

import httpx
import pytest

from infra.forge.wire import (
    SPOOL_IN_MEMORY,
    BodyTooLarge,
    UndecodableBody,
    UnsupportedEncoding,
    read_body,
)
from tests.support.forge import Team

LIMIT = 1024 * 1024


def _headers(**fields: str) -> Message:
    message = Message()
    for name, value in fields.items():
        message[name.replace("_", "-")] = value
    return message


def _read(wire: bytes, limit: int = LIMIT, chunked: bool = False, **fields: str) -> tuple[bytes, int]:
    if chunked:
        framed = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in _parts(wire, 1000)) + b"0\r\n\r\n"
        headers = _headers(Transfer_Encoding="chunked", **fields)
    else:
        framed = wire
        headers = _headers(Content_Length=str(len(wire)), **fields)
    body, size = read_body(io.BytesIO(framed), headers, limit)
    with body:
        return body.read(), size


def _parts(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def _bomb(decoded_size: int) -> bytes:
    """A gzip stream of ``decoded_size`` zero bytes, compressed piecewise so the test never holds them all."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1024 * 1024)
    out = [packer.compress(zeros) for _ in range(decoded_size // len(zeros))]
    return b"".join([*out, packer.flush()])


PAYLOAD = b"0032want " + os.urandom(20).hex().encode() + b"\n" * 3 + b"have deadbeef\n" * 400


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("coding", ["gzip", "x-gzip", "GZIP"])
def test_a_gzip_body_is_decoded_and_its_size_is_the_decoded_size(chunked: bool, coding: str) -> None:
    assert _read(gzip.compress(PAYLOAD), chunked=chunked, Content_Encoding=coding) == (PAYLOAD, len(PAYLOAD))


def test_a_body_bigger_than_the_in_memory_spool_decodes_intact() -> None:
    payload = os.urandom(1024) * (SPOOL_IN_MEMORY // 1024 + 512)
    wire = gzip.compress(payload, compresslevel=1)
    body, size = read_body(io.BytesIO(wire), _headers(Content_Length=str(len(wire)), Content_Encoding="gzip"), 1 << 30)
    with body:
        assert size == len(payload) and body.read() == payload


def test_gzip_members_back_to_back_and_zero_padding_are_one_body() -> None:
    wire = gzip.compress(b"first ") + gzip.compress(b"second") + bytes(16)
    assert _read(wire, Content_Encoding="gzip") == (b"first second", 12)


@pytest.mark.parametrize("raw", [False, True], ids=["zlib", "raw-deflate"])
def test_deflate_is_read_in_the_zlib_format_and_as_raw_deflate(raw: bool) -> None:
    packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS if raw else zlib.MAX_WBITS)
    wire = packer.compress(PAYLOAD) + packer.flush()
    assert _read(wire, Content_Encoding="deflate") == (PAYLOAD, len(PAYLOAD))


def test_stacked_codings_come_off_last_applied_first() -> None:
    wire = zlib.compress(gzip.compress(PAYLOAD))
    assert _read(wire, Content_Encoding="gzip, identity, deflate") == (PAYLOAD, len(PAYLOAD))


def test_identity_is_no_coding() -> None:
    assert _read(PAYLOAD, Content_Encoding="identity") == (PAYLOAD, len(PAYLOAD))


@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "gzip, br"])
def test_an_unknown_coding_is_refused_before_the_body_is_read(coding: str) -> None:
    stream = io.BytesIO(PAYLOAD)
    with pytest.raises(UnsupportedEncoding) as refused:
        read_body(stream, _headers(Content_Length=str(len(PAYLOAD)), Content_Encoding=coding), LIMIT)
    assert refused.value.coding == coding.rpartition(" ")[2] and stream.tell() == 0


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_gzip_bomb_under_the_wire_limit_is_refused_by_its_decoded_size(chunked: bool) -> None:
    wire = _bomb(64 * LIMIT)
    assert len(wire) < LIMIT
    with pytest.raises(BodyTooLarge):
        _read(wire, chunked=chunked, Content_Encoding="gzip")


def test_a_body_decoding_to_exactly_the_limit_is_accepted() -> None:
    assert _read(_bomb(LIMIT), Content_Encoding="gzip") == (bytes(LIMIT), LIMIT)


@pytest.mark.parametrize(
    ("coding", "wire"),
    [
        ("gzip", gzip.compress(PAYLOAD)[:-9]),
        ("gzip", b"definitely not gzip"),
        ("deflate", zlib.compress(PAYLOAD) + b"trailing"),
    ],
    ids=["truncated", "not-gzip", "after-the-end"],
)
def test_a_body_that_does_not_decode_is_undecodable(coding: str, wire: bytes) -> None:
    with pytest.raises(UndecodableBody):
        _read(wire, Content_Encoding=coding)


def _post_issue(team: Team, content: bytes, coding: str) -> httpx.Response:
    return httpx.post(
        f"{team.forge.api_url}/repos/alice/shop/issues",
        content=content,
        headers={
            "Authorization": f"token {team.alice}",
            "Content-Type": "application/json",
            "Content-Encoding": coding,
        },
    )


def test_the_api_reads_a_gzip_json_body(team: Team) -> None:
    resp = _post_issue(team, gzip.compress(json.dumps({"title": "zipped"}).encode()), "gzip")
    assert resp.status_code == 201 and resp.json()["title"] == "zipped"


def test_the_api_answers_415_naming_the_codings_it_reads(team: Team) -> None:
    resp = _post_issue(team, json.dumps({"title": "brotli?"}).encode(), "br")
    assert resp.status_code == 415
    assert resp.json()["message"] == "Unsupported Content-Encoding: br"
    assert resp.headers["accept-encoding"] == "gzip, x-gzip, deflate"
    assert [i.title for i in team.shop.get_issues()] == []


def test_the_api_answers_413_to_a_gzip_bomb_and_400_to_corrupt_gzip(team: Team) -> None:
    bomb = _post_issue(team, _bomb(40 * 1024 * 1024), "gzip")
    assert bomb.status_code == 413 and bomb.json()["message"] == "Request body too large"
    corrupt = _post_issue(team, b"\x1f\x8b not really", "gzip")
    assert corrupt.status_code == 400
    assert [i.title for i in team.shop.get_issues()] == []
