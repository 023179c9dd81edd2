"""Free TCP ports for servers this machine starts (an environment's app, the local stack's services).

A port is chosen, released, and then bound by the server a moment later. A port from the kernel's ephemeral
range (``bind(0)``) can be taken in that moment by any outgoing connection's source port, and on a busy host
(many clients, many tests) it is: a Temporal dev server died with "address already in use" that way. Ports are
therefore drawn at random from below the ephemeral range, which outgoing connections never use; only another
server choosing the same port in the same moment can still collide. Where the range leaves no room below it,
the kernel's choice is the fallback.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Below the ports of well-known local services (databases, brokers sit under 10000).
_LOWEST = 15000
_TRIES = 64


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' source ports (Linux's default when it cannot be read)."""
    try:
        low, high = (int(part) for part in _EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` just now, below the ephemeral range when there is room there."""
    low, _ = ephemeral_range()
    if low - _LOWEST >= 1000:
        draw = random.SystemRandom()
        for _ in range(_TRIES):
            port = draw.randrange(_LOWEST, low)
            if _bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        chosen: int = sock.getsockname()[1]
        return chosen
