"""Stand-ins for the worker's own services in the egress tests: listeners that record every connection."""

from __future__ import annotations

import ipaddress
import socket
import threading
from dataclasses import dataclass, field

from environments.egress import own_addresses
from tests.conftest import unavailable


@dataclass
class Listener:
    """A worker service stand-in: accepts on ``address`` and records every connection it gets."""

    address: str
    sock: socket.socket
    seen: list[bytes] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    @property
    def authority(self) -> str:
        return f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    self.seen.append(conn.recv(64) or b"(connected)")
                except OSError:
                    self.seen.append(b"(connected)")


def listen(address: str) -> Listener:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((address, 0))
    sock.listen(16)
    listener = Listener(address, sock)
    threading.Thread(target=listener.serve, daemon=True).start()
    return listener


def worker_address(excluded: frozenset[str] = frozenset()) -> str:
    """The worker's first non-loopback interface address (IPv4 first), other than ``excluded``."""
    found = sorted(
        (
            a
            for a in own_addresses()
            if not ipaddress.ip_address(a).is_loopback and not a.startswith("fe80") and a not in excluded
        ),
        key=lambda a: (":" in a, a),
    )
    if not found:
        unavailable("this worker has no non-loopback interface address to guard")
    return found[0]
