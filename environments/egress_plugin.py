"""The policy of setup's egress proxy, as a ``proxy.py`` plugin: loaded by the proxy process only (see
:mod:`environments.egress` for what it allows and why).

Per tunnel (``proxy.py`` makes one plugin instance per client connection): :meth:`before_upstream_connection`
refuses, before anything is connected, a request that is not a ``CONNECT``, names a host that is not allowed or
a port that is not, or whose name does not resolve or resolves to any forbidden address; otherwise it keeps the
first resolved address, and :meth:`resolve_dns` hands the proxy exactly that address to connect to (never
``None``, which would make the proxy resolve the name again). Each verdict is one JSON line in the policy's log.
"""

from __future__ import annotations

import json
import os
import socket
from functools import cache
from typing import Any, NoReturn

from proxy.common.types import HostPort
from proxy.http.exception import HttpRequestRejected
from proxy.http.parser import HttpParser
from proxy.http.proxy import HttpProxyBasePlugin

from environments.egress import POLICY_VAR, forbidden_reason, own_addresses

_MAX_LOGGED = 255


@cache
def _policy() -> dict[str, Any]:
    with open(os.environ[POLICY_VAR], encoding="utf-8") as fh:
        policy: dict[str, Any] = json.load(fh)
    policy["hosts"] = frozenset(policy["hosts"])
    policy["ports"] = frozenset(policy["ports"])
    # The worker's interface addresses as the proxy starts (one proxy per setup, so they are fresh).
    policy["own"] = own_addresses()
    return policy


def _log(verdict: str, host: str, port: int, address: str = "", reason: str = "") -> None:
    record = {"verdict": verdict, "host": host, "port": port, "address": address, "reason": reason}
    line = (json.dumps(record) + "\n").encode()
    # One write on an O_APPEND descriptor per event: lines of concurrent tunnels never interleave.
    fd = os.open(_policy()["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _printable(raw: bytes | None) -> str:
    """A host name as the setup sent it, safe to log: hostile bytes escaped, length capped."""
    text = (raw or b"").decode("ascii", errors="backslashreplace")
    return text.encode("unicode_escape").decode("ascii")[:_MAX_LOGGED]


class EgressPolicyPlugin(HttpProxyBasePlugin):
    """Allows ``CONNECT`` tunnels to the policy's hosts and ports whose every resolved address is allowed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._address: str | None = None
        self._target: tuple[str, int] | None = None

    def before_upstream_connection(self, request: HttpParser) -> HttpParser | None:
        policy = _policy()
        host = _printable(request.host).lower().rstrip(".")
        port = int(request.port or 0)
        if not request.is_https_tunnel:
            self._refuse(host, port, "only CONNECT tunnels are forwarded")
        if host not in policy["hosts"]:
            self._refuse(host, port, "not an allowed registry host")
        if port not in policy["ports"]:
            self._refuse(host, port, f"port {port} is not allowed")
        try:
            answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            self._refuse(host, port, f"does not resolve ({exc})")
        addresses = list(dict.fromkeys(str(answer[4][0]) for answer in answers))
        if not addresses:
            self._refuse(host, port, "does not resolve")
        for address in addresses:
            reason = forbidden_reason(address, policy["own"])
            if reason is not None:
                self._refuse(host, port, f"resolves to {reason}", address=address)
        self._address = addresses[0]
        self._target = (host, port)
        return request

    def resolve_dns(self, host: str, port: int) -> tuple[str | None, HostPort | None]:
        # The address checked above, for the host checked above; anything else is refused, never resolved anew.
        if self._address is None or self._target != (host.lower().rstrip("."), port):
            self._refuse(_printable(host.encode()), port, "not the checked tunnel")
        return self._address, None

    def handle_client_request(self, request: HttpParser) -> HttpParser | None:
        # Called once the upstream connection is up (for a tunnel, once: its bytes are not parsed after).
        if self._target is not None and self._address is not None:
            _log("reached", self._target[0], self._target[1], address=self._address)
            self._target = None
        return request

    def _refuse(self, host: str, port: int, reason: str, *, address: str = "") -> NoReturn:
        _log("refused", host, port, address=address, reason=reason)
        raise HttpRequestRejected(status_code=403, reason=b"Forbidden", body=f"durafix egress: {reason}\n".encode())
