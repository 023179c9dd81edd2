"""``durafix evidence ...``: serve the local store, apply retention.

- ``serve [--root DIR] [--host H] [--port P]``: the evidence server over ``--root``, else over the configured
  store, local or S3 (fronting S3 so reports carry the headers S3 cannot send); prints its base URL.
- ``gc --keep KIND=DAYS ...``: delete artifacts of each named kind last put more than DAYS ago from the
  configured store (local or S3); kinds not named are kept. Prints the deleted keys.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote, urlsplit

from evidence.interface import ArtifactKind
from evidence.open import open_store
from evidence.s3 import S3ArtifactStore, S3Credentials
from evidence.serve import access_from_environment, serve
from pipeline.cli.command import AddArguments
from pipeline.config import DurafixConfig


def _retention(text: str) -> tuple[ArtifactKind, float]:
    kind, sep, days = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KIND=DAYS, got {text!r}")
    try:
        return ArtifactKind(kind), float(days)
    except ValueError as err:
        kinds = ", ".join(k.value for k in ArtifactKind)
        raise argparse.ArgumentTypeError(f"bad retention {text!r} (kinds: {kinds}; days a number)") from err


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "The evidence store."
    sub = parser.add_subparsers(dest="action", required=True)
    s = sub.add_parser("serve", help="serve the evidence store (local or S3) over HTTP")
    s.add_argument("--root", type=Path, help="store directory (default: the configured local store)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=0, help="0 picks a free port")
    g = sub.add_parser("gc", help="delete expired artifacts")
    g.add_argument("--keep", type=_retention, action="append", required=True, metavar="KIND=DAYS")
    parser.set_defaults(fn=cmd_evidence)


def cmd_evidence(args: argparse.Namespace, config: DurafixConfig) -> int:
    """``evidence serve`` until interrupted (``--root``, else the configured store, local or S3), or
    ``evidence gc``: delete and print each expired key."""
    url = config.resolved_evidence_url()
    if args.action == "serve":
        try:
            access = access_from_environment()
        except ValueError as err:
            print(f"durafix evidence serve: $DURAFIX_EVIDENCE_LINK_SECRET: {err}", file=sys.stderr)
            return 2
        if args.root is not None:
            serve(args.root, args.host, args.port, access)
            return 0
        parts = urlsplit(url)
        if parts.scheme == "file":
            serve(Path(unquote(parts.path)), args.host, args.port, access)
            return 0
        # An S3 store: the server fronts it, so its reports are served with the headers S3 cannot send.
        store = open_store(url, credentials=_s3_credentials(config))
        if not isinstance(store, S3ArtifactStore):
            print(f"durafix evidence serve: the configured store {url} cannot be served", file=sys.stderr)
            return 2
        serve(store, args.host, args.port, access)
        return 0
    store = open_store(url, public_url=config.evidence_public_url or None)
    for key in store.delete_expired(datetime.now(UTC), dict(args.keep)):
        print(key)
    return 0


def _s3_credentials(config: DurafixConfig) -> S3Credentials | None:
    if config.evidence_access_key and config.evidence_secret_key:
        return S3Credentials(access_key_id=config.evidence_access_key, secret_access_key=config.evidence_secret_key)
    return None


ARGUMENTS: dict[str, AddArguments] = {"evidence": _arguments}
