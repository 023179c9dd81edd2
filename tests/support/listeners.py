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


# The hostile setup step of the egress tests: every way to the worker's services it has, each result written to
# attempts.json. Its argument names the targets: ``connect`` (name -> authority: a CONNECT tunnel asked of the
# proxy), ``get`` (name -> URL: a plain-HTTP forward asked of it) and ``direct`` (name -> [address, port]: a
# connection straight to it).
EGRESS_ATTACK = r"""
import json, socket, sys

targets = json.loads(sys.argv[1])
results = {}


def via_proxy(name, request):
    try:
        with socket.create_connection(("127.0.0.1", 3128), 10) as conn:
            conn.sendall(request)
            answer = conn.recv(200).split(b"\r\n", 1)[0].decode(errors="replace")
    except OSError as exc:
        answer = f"error {exc}"
    results[name] = "reached" if " 200 " in answer else f"blocked: {answer}"


def direct(name, address, port):
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as conn:
            conn.settimeout(5)
            conn.connect((address, port))
            conn.sendall(b"direct")
        results[name] = "reached"
    except OSError as exc:
        results[name] = f"blocked: {exc}"


for name, authority in targets["connect"].items():
    via_proxy(f"connect {name}", f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
for name, url in targets["get"].items():
    via_proxy(f"get {name}", f"GET {url} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
for name, (address, port) in targets["direct"].items():
    direct(f"direct {name}", address, port)
json.dump(results, open("attempts.json", "w"), indent=1)
"""
