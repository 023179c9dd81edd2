"""Signed links to artifacts on the evidence server: ``/a/<key>?sig=<mac>`` (and ``&exp=<epoch>`` when the link
expires), where ``mac`` is HMAC-SHA256 of the path (and the expiry) under a secret the server and the link's
maker share.

A signed link opens that one artifact and nothing else: the MAC covers the whole path, and the key in the path
names the artifact's content, so a link can be neither moved to another artifact nor point at changed bytes.
Without an expiry it stays valid until the secret changes (evidence links sit in PR comments for as long as a
review takes); rotating the secret revokes every link signed with the old one.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from urllib.parse import urlencode

SIG, EXP = "sig", "exp"


class LinkSigner:
    """Signs and checks artifact links with ``secret`` (at least 16 bytes; refused otherwise)."""

    def __init__(self, secret: str | bytes) -> None:
        key = secret.encode() if isinstance(secret, str) else secret
        if len(key) < 16:
            raise ValueError("a link-signing secret needs at least 16 bytes")
        self._key = key

    def _mac(self, path: str, expires_at: int | None) -> str:
        message = path if expires_at is None else f"{path}\n{expires_at}"
        return hmac.new(self._key, message.encode(), hashlib.sha256).hexdigest()

    def sign(self, path: str, *, expires_at: int | None = None) -> str:
        """``path`` (``/a/<key>``) with its signature (and expiry, seconds since the epoch) as a query."""
        query = {SIG: self._mac(path, expires_at)}
        if expires_at is not None:
            query[EXP] = str(expires_at)
        return f"{path}?{urlencode(query)}"

    def check(self, path: str, query: Mapping[str, str], now: float) -> str:
        """``""`` when ``query`` carries a valid, unexpired signature of ``path``; else why not (for the
        response: it never includes the expected signature)."""
        given = query.get(SIG, "")
        if not given:
            return "no signature"
        expiry_text = query.get(EXP)
        expires_at: int | None = None
        if expiry_text is not None:
            try:
                expires_at = int(expiry_text)
            except ValueError:
                return "malformed expiry"
        if not hmac.compare_digest(self._mac(path, expires_at).encode(), given.encode("utf-8", "replace")):
            return "bad signature"
        if expires_at is not None and now >= expires_at:
            return "link expired"
        return ""
