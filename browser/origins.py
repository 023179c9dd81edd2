"""Which origins a reproduction's page may reach: the app's own, plus those the repository's recipe declares.

An origin is ``scheme://host[:port]`` with scheme ``http`` or ``https`` (WebSockets ``ws``/``wss`` are
checked as the ``http``/``https`` origin they belong to). Origins compare normalized: scheme and host lower
case, the default port made explicit, so ``http://LocalHost`` and ``http://localhost:80`` are the same and
``http://localhost:8000`` another. ``127.0.0.1`` and ``localhost`` are different origins, as in a browser.

URLs that reach no network (``data:``, ``blob:``, ``about:``) are always allowed; every other scheme
(``file:``, ``chrome:``, ``ftp:``, ...) is blocked.

Two layers enforce a policy (``browser/session.py``): Playwright routing aborts and lists every request to
another origin; and the context's proxy is a dead end (a local port bound and never listened on) for every
host:port except the allowed ones (``proxy_bypass``, loopback included: Chromium would otherwise never
proxy loopback), so what routing does not see, such as the connection Chromium opens ahead of a frame's
navigation, cannot reach another server either.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}
# A WebSocket belongs to the origin of the same host and port over http(s).
_WEB_SCHEMES = {"http": "http", "https": "https", "ws": "http", "wss": "https"}
_LOCAL_SCHEMES = frozenset({"data", "blob", "about"})


def parse_origin(text: str) -> str:
    """``text`` normalized as an origin (``http://localhost:8000``); ``ValueError`` saying why it is not one
    (a path, a query, a fragment, credentials, another scheme, no host)."""
    try:
        url = urlsplit(text.strip())
        port = url.port
    except ValueError as err:
        raise ValueError(f"{text!r} is not an origin: {err}") from err
    if url.scheme not in _DEFAULT_PORTS:
        raise ValueError(f"{text!r} is not an origin: the scheme must be http or https")
    if not url.hostname:
        raise ValueError(f"{text!r} is not an origin: it names no host")
    if url.username is not None or url.password is not None:
        raise ValueError(f"{text!r} is not an origin: it carries credentials")
    if url.path not in ("", "/") or url.query or url.fragment or text.strip().endswith(("?", "#")):
        raise ValueError(f"{text!r} is not an origin: an origin is scheme://host[:port], with no path or query")
    return _format(url.scheme, url.hostname, port)


def origin_of(url: str) -> str | None:
    """The normalized origin ``url`` belongs to, or None when it has none we would allow (another scheme, or
    an unparsable URL)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = _WEB_SCHEMES.get(parts.scheme.lower())
    if scheme is None or not parts.hostname:
        return None
    return _format(scheme, parts.hostname, port)


def _format(scheme: str, host: str, port: int | None) -> str:
    scheme = scheme.lower()
    host = host.lower()
    if ":" in host:  # an IPv6 literal keeps its brackets in an origin
        host = f"[{host}]"
    return f"{scheme}://{host}:{port if port is not None else _DEFAULT_PORTS[scheme]}"


@dataclass(frozen=True)
class OriginPolicy:
    """The origins a page may reach; everything else is aborted before it leaves the browser."""

    allowed: tuple[str, ...]

    @classmethod
    def for_app(cls, base_url: str, extra: Iterable[str] = ()) -> OriginPolicy:
        """The app's origin (from ``base_url``) first, then ``extra`` (each checked with :func:`parse_origin`)."""
        app = origin_of(base_url)
        if app is None:
            raise ValueError(f"the app's base URL {base_url!r} has no http(s) origin")
        allowed = [app]
        for origin in extra:
            normalized = parse_origin(origin)
            if normalized not in allowed:
                allowed.append(normalized)
        return cls(tuple(allowed))

    def proxy_bypass(self) -> str:
        """Chromium's proxy bypass rules for the allowed origins (``host:port``, any scheme, so their
        WebSockets go direct too), with loopback's implicit bypass removed (``<-loopback>``)."""
        return ",".join(["<-loopback>", *(origin.split("://", 1)[1] for origin in self.allowed)])

    def allows(self, url: str) -> bool:
        scheme = url.split(":", 1)[0].lower()
        if scheme in _LOCAL_SCHEMES:
            return True
        return origin_of(url) in self.allowed
