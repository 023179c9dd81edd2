"""Setup's way out: an egress proxy that reaches the package registries and nothing else.

A recipe's setup with ``setup_network: true`` needs the package index, and nothing more. Its commands are
untrusted (a ``package.json`` script, a ``setup.py``), so they must not reach what the worker's own network
reaches: the services on the worker's loopback (the workflow server, the evidence server, a forge, model
proxies), the machines of its private network, cloud metadata (``169.254.169.254``). So such a setup runs in a
network namespace of its own with nothing but loopback (``bwrap --unshare-net``), and its one way out is this
proxy, running on the worker:

- **Only ``CONNECT`` tunnels to port 443 of an allowed host name**: the registry hosts of npm, yarn, pnpm, pip,
  uv and poetry by default (:data:`DEFAULT_REGISTRY_HOSTS`), or the operator's ``DURAFIX_SETUP_EGRESS``
  (comma-separated host names, exact; ``none`` for no host at all). No plain-HTTP forwarding: every registry
  speaks HTTPS, and a proxy that forwards plain requests would have to re-check every request of a kept-alive
  connection. An address literal is no host name and is refused.
- **The resolved address is checked before any connection, and it is the one connected to**: the proxy
  resolves the name once, refuses the tunnel if any answer is a loopback, link-local (the metadata address
  among them), private (RFC 1918, shared address space, unique-local IPv6), multicast, unspecified, reserved or
  benchmark address, or an address of one of the worker's own interfaces, and otherwise connects to the first
  answer itself, never resolving again (a name that answers a public address to the check and a loopback one
  to the connection, DNS rebinding, gets nowhere). IPv4-mapped and NAT64 IPv6 addresses are checked as the
  IPv4 address they carry. The documentation ranges (TEST-NET, ``2001:db8::/32``) are not refused: the public
  internet never routes them, so a network that does has put a registry or its mirror there on purpose.
- **Every tunnel is logged**, reached or refused, with the host, port, address and the reason of a refusal
  (:class:`EgressEvent`); the setup's log gets those lines (``# egress: ...``), so a run's evidence shows where
  its setup went.

Why these parts: the proxy is PyPI's ``proxy.py`` with a plugin of ours (:mod:`environments.egress_plugin`)
rather than Debian's ``tinyproxy`` (its ``Filter`` lists match names only: it cannot refuse a private address
that an allowed name resolves to, and it resolves on its own when it connects) or ``squid`` (its ``dst`` ACL
checks the resolved addresses, but it listens on TCP only and would need a configuration, cache and log tree
of its own per worker). ``proxy.py`` listens on a unix socket, and its plugin hooks let the plugin refuse a
tunnel before anything is connected and hand the proxy the very address it checked to connect to.

The sandbox reaches the proxy through that unix socket, bound into the sandbox at :data:`INSIDE_SOCKET`; a
small wrapper (:func:`bridged`) first starts Debian's ``socat`` inside the sandbox to listen on the sandbox's
own ``127.0.0.1:3128`` and forward each connection to the socket, then runs the setup command with
``HTTP_PROXY``/``HTTPS_PROXY`` and the package managers' proxy variables pointing there (:data:`PROXY_ENV`).
Not ``slirp4netns`` or ``pasta``: they give the namespace a routed network (NAT to the worker's), so the
sandbox could still reach every address the worker can besides the proxy, and keeping it from them would take
a firewall of its own; with the socket, there is no route out at all, and the proxy's rules are the only rules.

Lifecycle: one proxy per setup that asks for the network (:class:`EgressProxy`, started by the runner of
:func:`environments.checks.run_setup` in the sandboxed local provider and stopped when the setup ends, so
its log is that setup's alone), in a private directory of the worker's temporary directory (mode 0700, never
the workspace, never visible in any sandbox but through the bound socket). Its processes carry the setup's
ownership marker with ``/egress`` appended, so a worker that dies mid-setup leaves a proxy that the next try of
the same setup stops with its own (:meth:`EgressProxy.stop` stops every process carrying the marker), and that
its run's cleanup finds in any case. A setup without the network starts
none.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from environments.interface import EnvironmentError, Progress
from environments.processes import MARKER_VAR, start_time, stop_owned

# The setting naming the hosts setup may reach (comma-separated host names; ``none`` for no host).
EGRESS_VAR = "DURAFIX_SETUP_EGRESS"
# The registry hosts npm, yarn (classic and berry), pnpm, pip, uv and poetry download from by default.
DEFAULT_REGISTRY_HOSTS = (
    "registry.npmjs.org",
    "registry.yarnpkg.com",
    "repo.yarnpkg.com",
    "pypi.org",
    "files.pythonhosted.org",
)
# Where the proxy's socket is inside the sandbox, and where the bridge listens there.
INSIDE_SOCKET = "/run/durafix-egress.sock"
INSIDE_PORT = 3128
_INSIDE_URL = f"http://127.0.0.1:{INSIDE_PORT}"
# What setup commands get so that their package managers use the bridge.
PROXY_ENV = {
    **{name: _INSIDE_URL for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY")},
    **{name: _INSIDE_URL for name in ("npm_config_proxy", "npm_config_https_proxy", "PIP_PROXY")},
    **{name: _INSIDE_URL for name in ("YARN_HTTP_PROXY", "YARN_HTTPS_PROXY")},
    # Nothing bypasses the proxy: there is nowhere else to go, and a bypass would only fail less clearly.
    "NO_PROXY": "",
    "no_proxy": "",
}
# The environment variable that tells the proxy's plugin where its policy file is.
POLICY_VAR = "DURAFIX_EGRESS_POLICY"
ALLOWED_PORTS = (443,)
# The most of the plugin's log read back (about 20,000 tunnels): a setup asking for more is not logged further.
MAX_EVENT_LOG_BYTES = 4 * 1024 * 1024
SOCAT = "/usr/bin/socat"

# The bridge inside the sandbox: socat on the sandbox's own loopback, waited for (its listening socket shows
# in the namespace's /proc/net/tcp), then the command itself. socat dies with the sandbox's PID namespace.
_BRIDGE = f"""\
{SOCAT} TCP-LISTEN:{INSIDE_PORT},bind=127.0.0.1,reuseaddr,fork UNIX-CONNECT:{INSIDE_SOCKET} &
bridge=$!
tries=0
until grep -q ' 0100007F:{INSIDE_PORT:04X} 00000000:0000 0A ' /proc/net/tcp; do
  tries=$((tries + 1))
  if [ "$tries" -gt 1000 ] || ! kill -0 "$bridge" 2>/dev/null; then
    echo "durafix: the egress bridge did not start" >&2
    exit 125
  fi
  sleep 0.01
done
exec "$@"
"""

_HOST_NAME = re.compile(r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")
# Refused wherever they appear, beyond what ``ipaddress`` calls loopback, link-local, multicast, unspecified
# and reserved: the private ranges (not ``is_private``, which also covers the documentation ranges).
_PRIVATE_NETWORKS = tuple(
    ipaddress.ip_network(net)
    for net in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "255.255.255.255/32",
        "fc00::/7",
        "fec0::/10",
    )
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
METADATA_ADDRESS = "169.254.169.254"


class EgressError(EnvironmentError):
    """The egress proxy could not be started (the setup that needed it does not run)."""


class EgressHostError(ValueError):
    """A configured egress host is not a host name (the configuration does not load)."""


def parse_hosts(value: str | Sequence[str]) -> tuple[str, ...]:
    """``"pypi.org, files.pythonhosted.org"`` (the setting's form) or a list, as lower-case host names; ``none``
    (alone) for no host. Raises :class:`EgressHostError` for anything that is not a host name (an address literal,
    a port, a wildcard, a URL)."""
    parts = [part.strip() for part in value.split(",")] if isinstance(value, str) else [p.strip() for p in value]
    parts = [part for part in parts if part]
    if [part.lower() for part in parts] == ["none"]:
        return ()
    hosts: list[str] = []
    for part in parts:
        host = part.lower().rstrip(".")
        if not _HOST_NAME.match(host) or _is_address(host):
            raise EgressHostError(f"{EGRESS_VAR}: {part!r} is not a host name (no addresses, ports, wildcards or URLs)")
        if host not in hosts:
            hosts.append(host)
    return tuple(hosts)


def forbidden_reason(address: str, own: frozenset[str] = frozenset()) -> str | None:
    """Why setup may not reach ``address`` (a loopback, link-local, private, ... address, or one of ``own``, the
    worker's interface addresses), or ``None`` when it may."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        carried = ip.ipv4_mapped or (ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in _NAT64 else None)
        if carried is not None:
            reason = forbidden_reason(str(carried), own)
            return f"{reason} (carried in an IPv6 address)" if reason else None
    if str(ip) == METADATA_ADDRESS:
        return "the cloud metadata address"
    for reason, flag in (
        ("a loopback address", ip.is_loopback),
        ("a link-local address", ip.is_link_local),
        ("a multicast address", ip.is_multicast),
        ("an unspecified address", ip.is_unspecified),
        ("a reserved address", ip.is_reserved),
    ):
        if flag:
            return reason
    if any(ip.version == net.version and ip in net for net in _PRIVATE_NETWORKS):
        return "a private address"
    if str(ip) in own:
        return "an address of the worker"
    return None


def own_addresses() -> frozenset[str]:
    """The addresses of the worker's network interfaces (``ip -j address``), as ``ipaddress`` writes them; empty
    when ``ip`` is unusable (loopback and private addresses are refused anyway)."""
    try:
        said = subprocess.run(["ip", "-j", "address"], capture_output=True, text=True, timeout=10, check=False)
        interfaces = json.loads(said.stdout or "[]")
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return frozenset()
    found = set()
    for interface in interfaces:
        for info in interface.get("addr_info", []):
            try:
                found.add(str(ipaddress.ip_address(str(info.get("local", "")))))
            except ValueError:
                continue
    return frozenset(found)


def bridged(argv: Sequence[str]) -> list[str]:
    """``argv`` run inside the sandbox behind the bridge to the proxy's socket (see the module docstring)."""
    return ["/bin/sh", "-c", _BRIDGE, "durafix-egress", *argv]


@dataclass(frozen=True)
class EgressEvent:
    """One tunnel the setup asked the proxy for: ``reached`` (connected to ``address``) or ``refused`` (nothing
    connected; ``reason`` says why)."""

    verdict: str
    host: str
    port: int
    address: str = ""
    reason: str = ""

    def line(self) -> str:
        """How the setup log says it: ``reached pypi.org:443 at 151.101.0.223`` or ``refused 127.0.0.1:80: ...``."""
        where = f"{self.host}:{self.port}"
        if self.verdict == "reached":
            return f"reached {where} at {self.address}"
        at = f" at {self.address}" if self.address else ""
        return f"refused {where}{at}: {self.reason}"


EgressObserver = Callable[[Sequence[EgressEvent]], None]
_observers: list[EgressObserver] = []


def observe_egress(observer: EgressObserver) -> Callable[[], None]:
    """Have ``observer`` told every batch of events :func:`log_events` logs in this process, once each (a
    worker's metrics count them); returns what removes it. An observer must be quick and must not raise: it
    runs inside the setup."""
    _observers.append(observer)
    return lambda: _observers.remove(observer)


def log_events(events: Sequence[EgressEvent], log_path: Path | None, progress: Progress) -> None:
    """Append ``events`` (the ones not logged yet) to a setup's log (when there is one) as ``# egress: ...``
    lines, tell ``progress`` which allowed hosts were reached (``setup: egress reached pypi.org:443``) and
    how many tunnels were refused, and tell the observers (:func:`observe_egress`)."""
    if not events:
        return
    for observer in list(_observers):
        observer(events)
    if log_path is not None:
        with log_path.open("a", encoding="utf-8") as log:
            log.writelines(f"# egress: {event.line()}\n" for event in events)
    reached = sorted({f"{event.host}:{event.port}" for event in events if event.verdict == "reached"})
    if reached:
        progress(f"setup: egress reached {', '.join(reached)}")
    # A refused host is whatever the setup asked for (its text, not ours): counted in progress, which reaches
    # the run's status and history, and named only in the setup's log, which is stored redacted.
    refused = sum(1 for event in events if event.verdict == "refused")
    if refused:
        progress(f"setup: egress refused {refused} tunnel(s); the setup log names them")


def read_events(log: Path) -> list[EgressEvent]:
    """The events the plugin wrote to ``log`` (JSON lines), in order; lines it did not write whole are skipped."""
    events = []
    try:
        with log.open("rb") as fh:
            # How many tunnels a setup asks for is its own choice: read a bounded prefix, never the whole log.
            text = fh.read(MAX_EVENT_LOG_BYTES).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            data = json.loads(line)
            events.append(
                EgressEvent(
                    verdict=str(data["verdict"]),
                    host=str(data["host"]),
                    port=int(data["port"]),
                    address=str(data.get("address", "")),
                    reason=str(data.get("reason", "")),
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return events


class EgressProxy:
    """One running egress proxy (``proxy.py`` with :mod:`environments.egress_plugin`) on a unix socket.

    ``hosts``: the host names it lets tunnels reach (:func:`parse_hosts`), on ``ports``. ``marker``: the
    ownership marker its processes carry (see :mod:`environments.processes`). ``for_container``: the socket is
    bind-mounted into a container whose user is not the worker's, so it is made connectable by any user (the
    directory holding it stays the worker's, mode 0700: on this host only the worker reaches it), and this
    host's socat is not required (the bridge runs from the container's image). Use as a context manager, or
    :meth:`start` and :meth:`stop` (idempotent; removes its directory). :meth:`events` reads what it logged.
    """

    def __init__(
        self,
        hosts: Sequence[str],
        *,
        marker: str,
        ports: Sequence[int] = ALLOWED_PORTS,
        startup_timeout_s: float = 30.0,
        tunnel_idle_timeout_s: float = 120.0,
        for_container: bool = False,
    ) -> None:
        self.hosts = tuple(hosts)
        self.ports = tuple(ports)
        self.marker = marker
        self.startup_timeout_s = startup_timeout_s
        self.tunnel_idle_timeout_s = tunnel_idle_timeout_s
        self.for_container = for_container
        self.directory: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._started_at = 0

    @property
    def socket_path(self) -> Path:
        return self._dir() / "proxy.sock"

    @property
    def log_path(self) -> Path:
        """The plugin's JSON-lines log of tunnels reached and refused."""
        return self._dir() / "egress.jsonl"

    def start(self) -> None:
        """Start the proxy and wait until its socket accepts connections; :class:`EgressError` when it does not."""
        if self._proc is not None:
            return
        if not self.for_container and not Path(SOCAT).exists():
            raise EgressError(f"{SOCAT} is missing: setup's bridge to the egress proxy needs it (Debian package socat)")
        # Short and private: a unix socket path has a 108-byte limit, and no one but the worker may connect.
        self.directory = Path(tempfile.mkdtemp(prefix="durafix-egress-"))
        policy = self.directory / "policy.json"
        policy.write_text(
            json.dumps({"hosts": list(self.hosts), "ports": list(self.ports), "log": str(self.log_path)}),
            encoding="utf-8",
        )
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.directory),
            POLICY_VAR: str(policy),
            MARKER_VAR: self.marker,
        }
        argv = [
            sys.executable,
            "-m",
            "proxy",
            "--unix-socket-path",
            str(self.socket_path),
            "--plugins",
            "environments.egress_plugin.EgressPolicyPlugin",
            "--num-acceptors",
            "1",
            "--num-workers",
            "2",
            "--timeout",
            str(int(self.tunnel_idle_timeout_s)),
            "--data-dir",
            str(self.directory / "data"),
            "--log-level",
            "WARNING",
        ]
        with (self.directory / "proxy.log").open("ab") as out:
            self._proc = subprocess.Popen(
                argv,
                cwd=self.directory,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._started_at = start_time(self._proc.pid)
        deadline = time.monotonic() + self.startup_timeout_s
        while not self._accepts():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                said = (self.directory / "proxy.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise EgressError(f"the egress proxy did not start:\n{said}")
            time.sleep(0.05)
        if self.for_container:
            # Connecting to a unix socket takes write permission on it, which its owner alone has by default.
            os.chmod(self.socket_path, 0o666)

    def stop(self) -> None:
        """Stop the proxy's processes (its process group and anything carrying its marker) and remove its
        directory; idempotent."""
        if self._proc is not None:
            stop_owned(self.marker, pgid=self._proc.pid, leader_start=self._started_at, grace_s=2.0)
            # Reap it (stop_owned saw it die, or reports what survived SIGKILL).
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            self._proc = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def events(self) -> list[EgressEvent]:
        """What the proxy logged so far (empty before it started)."""
        return read_events(self.log_path) if self.directory is not None else []

    def __enter__(self) -> EgressProxy:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    def _dir(self) -> Path:
        if self.directory is None:
            raise EgressError("the egress proxy has not been started")
        return self.directory

    def _accepts(self) -> bool:
        if not self.socket_path.exists():
            return False
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(self.socket_path))
        except OSError:
            return False
        finally:
            probe.close()
        return True


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
