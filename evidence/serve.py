"""A small read-only HTTP server over an evidence store, local or S3 (``durafix evidence serve``).

Routes:

- ``GET /a/<key>``: the artifact's bytes with its media type. The object is hashed first and served only
  if it still matches the sha256 its key names (a tampered object gets 500, never its bytes). Responses
  are immutable (the key names the content) and carry ``nosniff`` and a Content-Security-Policy that lets
  an HTML report show ``data:`` images and inline styles but run nothing, and be framed by no page
  (``frame-ancestors 'none'``, with ``X-Frame-Options: DENY``).
- ``GET /``: an index of the stored reports, newest first.
- ``GET /healthz``: ``ok``.

``HEAD`` works wherever ``GET`` does. Only keys of the store's own shape are accepted, so no request
reaches outside ``<root>/objects`` (or the S3 store's prefix).

Over an S3 store the server is what sends the headers: S3 serves an object with the few headers it stores
(its media type, caching, disposition) and cannot send a Content-Security-Policy, so a report opened from a
presigned URL may be framed by any page. Set the store's ``public_url`` (``DURAFIX_EVIDENCE_PUBLIC_URL``) to
this server and the links point here. Each object is copied from S3 to a temporary file and checked against
the sha256 its key names before a byte of it is sent.

Who may read (:class:`Access`): a loopback client (``127.0.0.0/8``, ``::1``) everything, as the local stack
needs; any other client only ``/healthz``, plus an artifact with a link signed for it
(:mod:`evidence.links`, ``?sig=``) and everything with ``Authorization: Bearer <token>``. Otherwise 401 (no
credentials) or 403 (wrong token, a bad or expired signature), saying what is needed and never what was
expected. A server with neither token nor signing secret answers only loopback clients. Behind a reverse proxy
on the same host every client looks like loopback: run it with ``loopback_open=False`` there
(``--no-loopback-exemption``). The index lists signed links when the server can sign.
"""

from __future__ import annotations

import argparse
import hmac
import html
import ipaddress
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO
from urllib.parse import parse_qsl, unquote, urlsplit

from evidence.interface import ArtifactKind, ArtifactMissingError, ArtifactRef, IntegrityError
from evidence.keys import media_type_for, parse_key
from evidence.links import LinkSigner
from evidence.local import LocalArtifactStore
from evidence.open import open_store
from evidence.s3 import S3ArtifactStore
from evidence.signals import serve_until_signalled
from evidence.streams import hash_file

_SIGNATURE = re.compile(r"([?&]sig=)[^&\s\"]*")
# ``frame-ancestors 'none'``: no other page may frame a report (clickjacking); only a header can say so, a
# ``<meta>`` policy cannot. ``X-Frame-Options: DENY`` says the same to browsers that predate the directive.
_CSP = (
    "default-src 'none'; img-src data: 'self'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)


# The variables ``python -m evidence.serve`` reads its secrets from (never the command line: ps shows it).
TOKEN_VARIABLE, LINK_SECRET_VARIABLE = "DURAFIX_EVIDENCE_TOKEN", "DURAFIX_EVIDENCE_LINK_SECRET"


@dataclass(frozen=True)
class Access:
    """What a client that is not loopback needs (see the module's docstring).

    ``token``: a bearer token that opens everything. ``links``: the signer whose links open one artifact each.
    ``loopback_open``: loopback clients need nothing (off behind a reverse proxy on the same host).
    """

    token: str = ""
    links: LinkSigner | None = None
    loopback_open: bool = True

    def decide(self, client_host: str, path: str, query: dict[str, str], authorization: str | None) -> str:
        """``""`` when the request may be answered; else ``"401 ..."`` or ``"403 ..."``: status and reason."""
        if path == "/healthz" or (self.loopback_open and is_loopback(client_host)):
            return ""
        if authorization is not None:
            scheme, _, given = authorization.partition(" ")
            if scheme.lower() == "bearer" and self.token and _same(given.strip(), self.token):
                return ""
            return "403 the token is not accepted"
        if path.startswith("/a/") and self.links is not None and "sig" in query:
            why = self.links.check(path, query, time.time())
            return f"403 {why}" if why else ""
        if path.startswith("/a/") and "sig" in query:
            return "403 this server accepts no signed links"
        return (
            "401 this evidence server answers clients other than loopback only with a signed link to an artifact "
            "or a token (Authorization: Bearer ...)"
        )


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())


def is_loopback(host: str) -> bool:
    """Whether a client address is loopback (an IPv4-mapped ``::ffff:127.x`` too); a malformed one is not."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


ServedStore = LocalArtifactStore | S3ArtifactStore


def _media_type(meta: Mapping[str, object], kind: ArtifactKind, key: str) -> str:
    """The media type an artifact is served as: the one stored with it, else the one its kind and key imply."""
    return str(meta.get("media_type") or media_type_for(kind, key, None))


class EvidenceServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, store: ServedStore, host: str, port: int, access: Access | None = None) -> None:
        self.store = store
        self.access = access or Access()
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[0], self.server_address[1]
        return f"http://{host!s}:{port}"


class _Handler(BaseHTTPRequestHandler):
    server: EvidenceServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._respond(send_body=True)

    def do_HEAD(self) -> None:
        self._respond(send_body=False)

    def log_message(self, format: str, *args: object) -> None:
        # A signature is a capability for its artifact: the log names the request, not the key to it.
        line = _SIGNATURE.sub(r"\1redacted", format % args)
        sys.stderr.write(f"evidence-serve {self.address_string()} {line}\n")

    def _respond(self, *, send_body: bool) -> None:
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        refusal = self.server.access.decide(
            str(self.client_address[0]), path, dict(parse_qsl(parts.query)), self.headers.get("Authorization")
        )
        if refusal:
            code, _, reason = refusal.partition(" ")
            self._send_text(HTTPStatus(int(code)), reason + "\n", send_body, challenge=code == "401")
            return
        if path == "/healthz":
            self._send_text(HTTPStatus.OK, "ok\n", send_body)
        elif path == "/":
            self._send_index(send_body)
        elif path.startswith("/a/"):
            self._send_object(path.removeprefix("/a/"), send_body)
        else:
            self._send_text(HTTPStatus.NOT_FOUND, "not found\n", send_body)

    def _send_object(self, key: str, send_body: bool) -> None:
        try:
            kind, expected_sha256 = parse_key(key)
        except ValueError:
            self._send_text(HTTPStatus.BAD_REQUEST, "malformed artifact key\n", send_body)
            return
        store = self.server.store
        if isinstance(store, S3ArtifactStore):
            self._send_s3_object(store, key, kind, expected_sha256, send_body)
            return
        try:
            path = store.object_path(key)
            src = store.open_object(key)
        except ArtifactMissingError:
            self._send_no_such_artifact(send_body)
            return
        with src:
            sha256, size = hash_file(path)
            if sha256 != expected_sha256:
                self._send_failed_integrity(send_body)
                return
            media_type = _media_type(store.stored_meta(key) or {}, kind, key)
            self._send_artifact(src, media_type, size, sha256, send_body)

    def _send_s3_object(
        self, store: S3ArtifactStore, key: str, kind: ArtifactKind, expected_sha256: str, send_body: bool
    ) -> None:
        meta = store.stored_meta(key)
        if meta is None:
            self._send_no_such_artifact(send_body)
            return
        media_type = _media_type(meta, kind, key)
        ref = ArtifactRef(
            key=key,
            sha256=expected_sha256,
            size=int(str(meta["size"])),
            kind=kind,
            media_type=media_type,
            name=key.rsplit("/", 1)[-1],
            run_id="",
            created_at=str(meta.get("created_at", "")),
        )
        with tempfile.TemporaryDirectory(prefix="evidence-serve-") as scratch:
            try:
                path = store.get_to_file(ref, Path(scratch) / "object")
            except IntegrityError:
                self._send_failed_integrity(send_body)
                return
            except ArtifactMissingError:
                self._send_no_such_artifact(send_body)
                return
            with path.open("rb") as src:
                self._send_artifact(src, media_type, ref.size, ref.sha256, send_body)

    def _send_no_such_artifact(self, send_body: bool) -> None:
        self._send_text(HTTPStatus.NOT_FOUND, "no such artifact\n", send_body)

    def _send_failed_integrity(self, send_body: bool) -> None:
        self._send_text(HTTPStatus.INTERNAL_SERVER_ERROR, "artifact failed its integrity check\n", send_body)

    def _send_artifact(self, src: BinaryIO, media_type: str, size: int, sha256: str, send_body: bool) -> None:
        self._send_artifact_headers(media_type, size, sha256)
        if send_body:
            shutil.copyfileobj(src, self.wfile)

    def _send_artifact_headers(self, media_type: str, size: int, sha256: str) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", media_type)
        self.send_header("Content-Length", str(size))
        self.send_header("Cache-Control", "public, max-age=31536000, immutable")
        self.send_header("ETag", f'"{sha256}"')
        self._end_headers_hardened()

    def _end_headers_hardened(self) -> None:
        """End the headers of any answer with the ones every answer carries: stored artifacts are untrusted
        content, so no type sniffing, the policy of ``_CSP`` and no framing."""
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", _CSP)
        self.send_header("X-Frame-Options", "DENY")
        self.end_headers()

    def _send_index(self, send_body: bool) -> None:
        store = self.server.store
        entries = []
        for key in store.keys(ArtifactKind.REPORT):
            meta = store.stored_meta(key) or {}
            entries.append((str(meta.get("created_at", "")), key))
        entries.sort(reverse=True)
        links = self.server.access.links
        items = "".join(
            f'<li><a href="{html.escape(links.sign(f"/a/{key}") if links else f"/a/{key}")}">'
            f"{html.escape(created or key)}</a> <code>{parse_key(key)[1][:16]}</code></li>"
            for created, key in entries
        )
        page = (
            '<!doctype html><html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">'
            "<title>durafix evidence</title></head><body><h1>Evidence reports</h1>"
            f"<ul>{items or '<li>none yet</li>'}</ul></body></html>\n"
        )
        self._send_text(HTTPStatus.OK, page, send_body, media_type="text/html; charset=utf-8")

    def _send_text(
        self,
        status: HTTPStatus,
        text: str,
        send_body: bool,
        media_type: str = "text/plain; charset=utf-8",
        *,
        challenge: bool = False,
    ) -> None:
        data = text.encode("utf-8")
        self.send_response(status)
        if challenge:
            self.send_header("WWW-Authenticate", 'Bearer realm="durafix evidence"')
        self.send_header("Content-Type", media_type)
        self.send_header("Content-Length", str(len(data)))
        self._end_headers_hardened()
        if send_body:
            self.wfile.write(data)


def make_server(
    store_root: Path | ServedStore, host: str = "127.0.0.1", port: int = 0, access: Access | None = None
) -> EvidenceServer:
    """A bound server over a local store's directory, or over ``store`` itself (local or S3); port 0 picks a
    free port. Run it with ``serve_forever``."""
    store = LocalArtifactStore(store_root) if isinstance(store_root, Path) else store_root
    return EvidenceServer(store, host, port, access)


def access_from_environment(environ: Mapping[str, str] | None = None, *, loopback_open: bool = True) -> Access:
    """:class:`Access` from ``$DURAFIX_EVIDENCE_TOKEN`` and ``$DURAFIX_EVIDENCE_LINK_SECRET`` (either may be
    unset); ``ValueError`` for a signing secret shorter than 16 bytes."""
    env = os.environ if environ is None else environ
    secret = env.get(LINK_SECRET_VARIABLE, "")
    return Access(
        token=env.get(TOKEN_VARIABLE, ""), links=LinkSigner(secret) if secret else None, loopback_open=loopback_open
    )


def serve(store_root: Path | ServedStore, host: str = "127.0.0.1", port: int = 0, access: Access | None = None) -> None:
    """Serve a local store's directory, or ``store`` itself, until SIGINT or SIGTERM; prints the base URL on
    stdout once listening. ``access`` ``None``: from the environment (:func:`access_from_environment`), which
    is how ``durafix evidence serve`` is configured."""
    server = make_server(store_root, host, port, access if access is not None else access_from_environment())
    thread = threading.Thread(target=server.serve_forever, name="evidence-serve", daemon=True)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    serve_until_signalled(server.url, thread.start, stop)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--root", type=Path, help="the local evidence store's directory")
    source.add_argument(
        "--url",
        help="an evidence store URL (s3://bucket/prefix?endpoint=...&region=...; credentials from AWS_* or "
        "boto3's default chain)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    parser.add_argument(
        "--no-loopback-exemption",
        action="store_true",
        help="loopback clients need a token or signed link too (behind a reverse proxy on the same host)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evidence.serve",
        description="Serve a local evidence store over HTTP. Clients other than loopback need a token "
        f"(${TOKEN_VARIABLE}) or a link signed with ${LINK_SECRET_VARIABLE}.",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        access = access_from_environment(loopback_open=not args.no_loopback_exemption)
    except ValueError as err:
        parser.error(f"${LINK_SECRET_VARIABLE}: {err}")
    if args.root is not None:
        serve(args.root, args.host, args.port, access)
        return 0
    try:
        store = open_store(args.url)
    except ValueError as err:
        parser.error(f"--url: {err}")
    if not isinstance(store, LocalArtifactStore | S3ArtifactStore):
        parser.error(f"--url: {args.url} is no store this server can serve")
    serve(store, args.host, args.port, access)
    return 0


if __name__ == "__main__":
    sys.exit(main())
