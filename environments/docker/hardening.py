"""The hardening every container of the Docker provider gets, whatever it runs (setup, the app, the tests).

An init as PID 1 (so orphans are reaped and a signal reaches the command), the recipe's memory (swap included),
pids and CPU limits, no capability at all, ``no-new-privileges`` (a setuid binary in the image gains nothing),
and a bounded JSON log. The caller adds what differs: the command, the user, the network, mounts.
"""

from __future__ import annotations

from typing import Any

from docker.types import LogConfig

from environments.interface import ResourceLimits


def hardened(limits: ResourceLimits) -> dict[str, Any]:
    """Keyword arguments for ``containers.create``/``run`` that every provider container carries."""
    return {
        "init": True,
        "mem_limit": f"{limits.memory_mb}m",
        "memswap_limit": f"{limits.memory_mb}m",
        "pids_limit": limits.pids,
        "nano_cpus": int(limits.cpus * 1_000_000_000),
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "log_config": LogConfig(type="json-file", config={"max-size": "10m", "max-file": "2"}),
    }
