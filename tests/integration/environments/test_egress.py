"""Setup's egress proxy on its own: which addresses it refuses, which host names the setting takes, the proxy's
lifecycle (a real ``proxy.py`` on a unix socket), a setup without the network getting no way out at all, and
the plugin against scripted DNS answers (a rebinding name, a name with one forbidden answer among public ones),
which no real resolver here can give."""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest
from proxy.http.exception import HttpRequestRejected
from proxy.http.parser import HttpParser, httpParserTypes

from environments import egress_plugin
from environments.checks import SetupSettings, run_setup
from environments.egress import (
    DEFAULT_REGISTRY_HOSTS,
    INSIDE_SOCKET,
    POLICY_VAR,
    EgressHostError,
    EgressProxy,
    forbidden_reason,
    parse_hosts,
    read_events,
)
from environments.interface import AppRecipe
from environments.processes import owned_pids
from environments.sandbox import Sandbox
from pipeline.config import load_config
from tests.support.sandbox import require_bubblewrap


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "a loopback address"),
        ("127.8.9.10", "a loopback address"),
        ("::1", "a loopback address"),
        ("169.254.169.254", "the cloud metadata address"),
        ("169.254.1.1", "a link-local address"),
        ("fe80::1%eth0", "a link-local address"),
        ("10.1.2.3", "a private address"),
        ("172.20.0.1", "a private address"),
        ("192.168.1.1", "a private address"),
        ("100.64.0.1", "a private address"),
        ("fd00::1", "a private address"),
        ("0.0.0.0", "an unspecified address"),
        ("::", "an unspecified address"),
        ("224.0.0.1", "a multicast address"),
        ("240.0.0.1", "a reserved address"),
        ("::ffff:127.0.0.1", "a loopback address (carried in an IPv6 address)"),
        ("::ffff:169.254.169.254", "the cloud metadata address (carried in an IPv6 address)"),
        ("64:ff9b::10.0.0.1", "a private address (carried in an IPv6 address)"),
        ("151.101.0.223", None),
        ("2a04:4e42::223", None),
        # Documentation ranges: never routed on the internet, so a network that routes them chose to.
        ("203.0.113.80", None),
    ],
)
def test_forbidden_addresses(address: str, reason: str | None) -> None:
    assert forbidden_reason(address) == reason


def test_the_workers_own_addresses_are_refused() -> None:
    own = frozenset({"192.0.2.2", "2001:db8::2"})
    assert forbidden_reason("192.0.2.2", own) == "an address of the worker"
    assert forbidden_reason("2001:db8::2", own) == "an address of the worker"
    assert forbidden_reason("::ffff:192.0.2.2", own) == "an address of the worker (carried in an IPv6 address)"
    assert forbidden_reason("192.0.2.3", own) is None


def test_egress_hosts_are_host_names_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_hosts(" PyPI.org, files.pythonhosted.org.,pypi.org ") == ("pypi.org", "files.pythonhosted.org")
    assert parse_hosts("none") == () and parse_hosts(["registry.npmjs.org"]) == ("registry.npmjs.org",)
    for bad in ("127.0.0.1", "::1", "pypi.org:443", "*.pypi.org", "https://pypi.org", "a b", "-x.org"):
        with pytest.raises(EgressHostError, match="not a host name"):
            parse_hosts(bad)
    assert load_config(tmp_path).setup_egress == list(DEFAULT_REGISTRY_HOSTS)
    monkeypatch.setenv("DURAFIX_SETUP_EGRESS", "npm.example.com, pypi.example.com")
    assert load_config(tmp_path).setup_egress == ["npm.example.com", "pypi.example.com"]
    monkeypatch.setenv("DURAFIX_SETUP_EGRESS", "169.254.169.254")
    with pytest.raises(ValueError, match="not a host name"):
        load_config(tmp_path)
    with pytest.raises(EgressHostError):
        SetupSettings(egress_hosts=("localhost:80",))


def connect(proxy: EgressProxy, authority: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(str(proxy.socket_path))
        conn.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        return conn.recv(200).split(b"\r\n", 1)[0].decode()


def test_the_proxy_refuses_before_connecting_logs_each_tunnel_and_leaves_nothing(tmp_path: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    marker = f"egress-test/{uuid.uuid4().hex}"
    proxy = EgressProxy(("localhost",), ports=(port,), marker=marker)
    with proxy:
        directory = proxy.directory
        assert directory is not None and oct(directory.stat().st_mode & 0o777) == "0o700"
        assert owned_pids(marker)
        # An allowed name on an allowed port, refused on its resolved (loopback) address; a literal, on its name.
        assert connect(proxy, f"localhost:{port}") == "HTTP/1.1 403 Forbidden"
        assert connect(proxy, f"127.0.0.1:{port}") == "HTTP/1.1 403 Forbidden"
        assert connect(proxy, "localhost:443") == "HTTP/1.1 403 Forbidden"
        events = [event.line() for event in proxy.events()]
    with pytest.raises(TimeoutError):
        listener.accept()
    listener.close()
    assert events == [
        f"refused localhost:{port} at 127.0.0.1: resolves to a loopback address",
        f"refused 127.0.0.1:{port}: not an allowed registry host",
        "refused localhost:443: port 443 is not allowed",
    ]
    assert owned_pids(marker) == set() and not directory.exists()


def test_a_setup_without_the_network_gets_no_proxy(tmp_path: Path) -> None:
    require_bubblewrap()
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "probe.py").write_text(
        f"import json, os\nSOCKET = {INSIDE_SOCKET!r}\n"
        "seen = {'socket': os.path.exists(SOCKET), 'proxy': sorted(k for k in os.environ if 'proxy' in k.lower())}\n"
        "json.dump(seen, open('seen.json', 'w'))\n"
    )
    recipe = AppRecipe(setup=["python3 probe.py"], setup_network=False, start="true", test="true")
    outcome = run_setup(
        ws, recipe, marker=f"t/{uuid.uuid4().hex}", log_path=tmp_path / "s.log", timeout_s=60, sandbox=Sandbox.detect()
    )
    assert outcome.ran and outcome.egress == ()
    assert json.loads((ws / "seen.json").read_text()) == {"socket": False, "proxy": []}
    assert "# egress:" not in (tmp_path / "s.log").read_text()


class Resolver:
    """Answers a name's lookups from a script, one answer per call, and counts the calls: a name that is public
    when checked and loopback when connected to (DNS rebinding), or that answers a private address among
    public ones."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, host: str, port: int, *args: object, **kwargs: object) -> list[tuple[Any, ...]]:
        self.calls += 1
        addresses = self.answers[min(self.calls, len(self.answers)) - 1]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)) for address in addresses]


def plugin_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hosts: list[str]) -> egress_plugin.EgressPolicyPlugin:
    """The plugin as the proxy process builds it, with its policy file (the proxy's own objects are unused)."""
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"hosts": hosts, "ports": [443], "log": str(tmp_path / "egress.jsonl")}))
    monkeypatch.setenv(POLICY_VAR, str(policy))
    egress_plugin._policy.cache_clear()
    none: Any = None
    return egress_plugin.EgressPolicyPlugin("uid", none, none, none)


def connect_request(authority: str) -> HttpParser:
    request = HttpParser(httpParserTypes.REQUEST_PARSER)
    request.parse(memoryview(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()))
    return request


def test_the_plugin_resolves_once_and_connects_to_the_address_it_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rebinding = Resolver(["151.101.0.223"], ["127.0.0.1"])
    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    plugin = plugin_for(tmp_path, monkeypatch, ["rebind.example"])
    try:
        assert plugin.before_upstream_connection(connect_request("rebind.example:443")) is not None
        # What the proxy connects to: the checked answer, not a second lookup's.
        assert plugin.resolve_dns("rebind.example", 443) == ("151.101.0.223", None)
        assert rebinding.calls == 1
        # A lookup for anything but the checked tunnel is refused, never resolved.
        with pytest.raises(HttpRequestRejected):
            plugin.resolve_dns("other.example", 443)
    finally:
        egress_plugin._policy.cache_clear()


def test_the_plugin_refuses_a_name_with_any_forbidden_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", Resolver(["151.101.0.223", "169.254.169.254"]))
    plugin = plugin_for(tmp_path, monkeypatch, ["mixed.example"])
    try:
        with pytest.raises(HttpRequestRejected):
            plugin.before_upstream_connection(connect_request("mixed.example:443"))
        with pytest.raises(HttpRequestRejected):
            plugin.resolve_dns("mixed.example", 443)
    finally:
        egress_plugin._policy.cache_clear()
    assert [event.line() for event in read_events(tmp_path / "egress.jsonl")] == [
        "refused mixed.example:443 at 169.254.169.254: resolves to the cloud metadata address",
        "refused mixed.example:443: not the checked tunnel",
    ]


def test_a_proxy_left_by_an_earlier_try_is_stopped_and_the_setups_own_is_gone_after_it(tmp_path: Path) -> None:
    require_bubblewrap()
    ws = tmp_path / "ws"
    ws.mkdir()
    marker = f"t/{uuid.uuid4().hex}"
    # What a worker killed during the setup leaves: the proxy, still running under the setup's marker.
    leftover = EgressProxy(DEFAULT_REGISTRY_HOSTS, marker=f"{marker}/egress")
    leftover.start()
    process = leftover._proc
    assert process is not None
    try:
        recipe = AppRecipe(
            setup=[f"test -S {INSIDE_SOCKET} && echo bridged > seen.txt"], setup_network=True, start="true", test="true"
        )
        outcome = run_setup(
            ws, recipe, marker=marker, log_path=tmp_path / "s.log", timeout_s=60, sandbox=Sandbox.detect()
        )
        # Stopped with the setup's own proxy (the same marker), not by the stop() below.
        assert process.poll() is not None
    finally:
        leftover.stop()
    assert (ws / "seen.txt").read_text() == "bridged\n"
    assert outcome.ran and outcome.egress == ()
    assert owned_pids(f"{marker}/egress") == set()
