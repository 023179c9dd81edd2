"""Hosts on one machine: network namespaces on a private bridge, for tests and benchmarks (root only).

:class:`Network` makes a bridge in the root namespace (it carries ``SUBNET.100``, so the process that made the
network, a test, reaches every host) and, per :meth:`Network.add_host`, a namespace with its own loopback and
one veth link to the bridge at ``SUBNET.N``. Nothing else is routed: a host reaches its own loopback and the
other hosts' addresses only. :meth:`Network.cut` takes a host's link down (its processes keep running, as on a
host whose switch port died) and :meth:`Network.restore` brings it back. :meth:`Network.close` removes every
namespace and link it made; it is idempotent and also runs when setting up failed half-way.

Processes run on a host through ``nsenter --net`` (:meth:`Host.argv`), which changes the network namespace only:
the file system, users and process tree are the machine's, so a test still sees every process and file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

# A /24 in 10.0.0.0/8 chosen per network, so two test processes on one machine never share addresses.
_SECOND_OCTET = 213
_ROOT_HOST = 100


class NetnsError(RuntimeError):
    """The network could not be made (not root, no iproute2, or the kernel refused)."""


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "nsenter") if shutil.which(tool) is None]
    return f"not installed: {', '.join(missing)} (apt-get install iproute2 util-linux)" if missing else None


def _ip(*args: str, ns: str | None = None) -> None:
    argv = ["ip", *(["-n", ns] if ns else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {done.stderr.strip()}")


@dataclass
class Host:
    """One namespace on the network."""

    name: str
    netns: str
    address: str
    link: str  # the root side of its veth pair: what :meth:`Network.cut` takes down

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run on this host."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--", *argv]


@dataclass
class Network:
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    hosts: dict[str, Host] = field(default_factory=dict)
    _third: int = field(default_factory=lambda: 1 + secrets.randbelow(250))
    _made_bridge: bool = False

    @property
    def bridge(self) -> str:
        return f"dfxb{self.tag}"

    @property
    def subnet(self) -> str:
        return f"10.{_SECOND_OCTET}.{self._third}"

    @property
    def root_address(self) -> str:
        """The address the machine itself has on the network."""
        return f"{self.subnet}.{_ROOT_HOST}"

    def __enter__(self) -> Network:
        reason = unavailable_reason()
        if reason is not None:
            raise NetnsError(reason)
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._made_bridge = True
            _ip("addr", "add", f"{self.root_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_host(self, name: str) -> Host:
        n = len(self.hosts) + 1
        host = Host(name=name, netns=f"dfx-{self.tag}-{name}", address=f"{self.subnet}.{n}", link=f"dfx{self.tag}{n}")
        peer = f"dfp{self.tag}{n}"
        try:
            _ip("netns", "add", host.netns)
            self.hosts[name] = host
            _ip("link", "add", host.link, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", host.netns)
            _ip("link", "set", host.link, "master", self.bridge, "up")
            _ip("link", "set", "lo", "up", ns=host.netns)
            _ip("link", "set", peer, "name", "eth0", ns=host.netns)
            _ip("addr", "add", f"{host.address}/24", "dev", "eth0", ns=host.netns)
            _ip("link", "set", "eth0", "up", ns=host.netns)
        except BaseException:
            self.close()
            raise
        return host

    def cut(self, name: str) -> None:
        """Take host ``name`` off the network; what runs on it keeps running."""
        _ip("link", "set", self.hosts[name].link, "down")

    def restore(self, name: str) -> None:
        _ip("link", "set", self.hosts[name].link, "up")

    def close(self) -> None:
        for host in self.hosts.values():
            with contextlib.suppress(NetnsError):
                _ip("link", "del", host.link)
            with contextlib.suppress(NetnsError):
                _ip("netns", "del", host.netns)
        self.hosts.clear()
        if self._made_bridge:
            with contextlib.suppress(NetnsError):
                _ip("link", "del", self.bridge)
            self._made_bridge = False


def netns_processes(netns: str) -> list[int]:
    """The processes whose network namespace is ``netns`` (what a cut-off host still runs)."""
    try:
        target = os.stat(f"/run/netns/{netns}")
    except FileNotFoundError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            st = os.stat(entry / "ns" / "net")
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                found.append(int(entry.name))
    return sorted(found)
