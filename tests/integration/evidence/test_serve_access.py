"""Who the evidence server answers, over real HTTP to a real server process: loopback clients as before,
any other client only with a bearer token or a link signed for the artifact. "Another client" is this host
reached through its own non-loopback address (the server then sees that address as the client's)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from evidence.interface import ArtifactKind, ArtifactRef
from evidence.links import LinkSigner
from evidence.local import LocalArtifactStore
from evidence.serve import is_loopback
from tests.conftest import unavailable

TOKEN = "operator-token-0123456789"
SECRET = "link-signing-secret-0123456789"


def own_address() -> str:
    """This host's address on its default route (no packet is sent: a UDP socket only picks its source)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.254", 9))
            address = str(probe.getsockname()[0])
        except OSError as err:
            unavailable(f"this host has no non-loopback IPv4 address: {err}")
    if is_loopback(address):
        unavailable("this host has no non-loopback IPv4 address")
    return address


@dataclass
class Served:
    store: LocalArtifactStore
    port: int
    remote: str  # the server's base URL through the host's non-loopback address
    local: str  # the same server through 127.0.0.1
    report: ArtifactRef
    log: ArtifactRef
    stderr: str = ""  # what the server logged, once it has stopped


def start(tmp_path: Path, env: dict[str, str], *args: str) -> Iterator[Served]:
    root = tmp_path / "store"
    store = LocalArtifactStore(root)
    report = store.put_bytes(b"<!doctype html><p>report</p>", kind=ArtifactKind.REPORT, run_id="r", name="r.html")
    log = store.put_bytes(b"the test log", kind=ArtifactKind.LOG, run_id="r")
    base = {k: v for k, v in os.environ.items() if not k.startswith("DURAFIX_EVIDENCE_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "evidence.serve", "--root", str(root), "--host", "0.0.0.0", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**base, **env},
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://0.0.0.0:"), proc.stderr.read() if proc.stderr else ""
        port = int(url.rsplit(":", 1)[1])
        served = Served(store, port, f"http://{own_address()}:{port}", f"http://127.0.0.1:{port}", report, log)
        yield served
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    assert proc.stderr is not None
    served.stderr = proc.stderr.read()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server with a token and a signing secret for the tests that only read (a process start is slow)."""
    yield from start(
        tmp_path_factory.mktemp("served"), {"DURAFIX_EVIDENCE_TOKEN": TOKEN, "DURAFIX_EVIDENCE_LINK_SECRET": SECRET}
    )


def get(url: str, **headers: str) -> httpx.Response:
    return httpx.get(url, headers=headers, timeout=5)


def test_loopback_clients_are_answered_as_before(served: Served) -> None:
    assert get(f"{served.local}/a/{served.log.key}").content == b"the test log"
    assert served.report.key in get(f"{served.local}/").text


def test_another_client_without_credentials_gets_401_and_nothing_of_the_store(served: Served) -> None:
    for path in (f"/a/{served.log.key}", "/"):
        response = get(f"{served.remote}{path}")

        assert response.status_code == 401
        assert response.headers["www-authenticate"] == 'Bearer realm="durafix evidence"'
        assert "only with a signed link to an artifact or a token" in response.text
        assert b"the test log" not in response.content and served.report.key not in response.text
    # A load balancer's health check needs no credentials.
    assert get(f"{served.remote}/healthz").text == "ok\n"


def test_a_bearer_token_opens_everything_and_a_wrong_one_nothing(served: Served) -> None:
    good = {"Authorization": f"Bearer {TOKEN}"}

    assert get(f"{served.remote}/a/{served.log.key}", **good).content == b"the test log"
    assert served.report.key in get(f"{served.remote}/", **good).text

    wrong = get(f"{served.remote}/a/{served.log.key}", Authorization="Bearer guessed")
    assert (wrong.status_code, wrong.text) == (403, "the token is not accepted\n")
    assert TOKEN not in wrong.text


def test_a_signed_link_opens_its_own_artifact_only(served: Served) -> None:
    signer = LinkSigner(SECRET)
    link = signer.sign(f"/a/{served.log.key}")

    assert get(f"{served.remote}{link}").content == b"the test log"

    moved = link.replace(served.log.key, served.report.key)
    assert (get(f"{served.remote}{moved}").status_code, get(f"{served.remote}{moved}").text) == (
        403,
        "bad signature\n",
    )
    forged = LinkSigner("someone else's secret!").sign(f"/a/{served.log.key}")
    assert get(f"{served.remote}{forged}").status_code == 403
    # A signed link is for one artifact, not the index.
    assert get(f"{served.remote}/?{link.split('?', 1)[1]}").status_code == 401


def test_a_link_with_an_expiry_works_until_then_and_its_expiry_cannot_be_changed(served: Served) -> None:
    signer = LinkSigner(SECRET)
    path = f"/a/{served.log.key}"
    later, past = int(time.time()) + 3600, int(time.time()) - 1

    assert get(f"{served.remote}{signer.sign(path, expires_at=later)}").status_code == 200
    expired = get(f"{served.remote}{signer.sign(path, expires_at=past)}")
    assert (expired.status_code, expired.text) == (403, "link expired\n")
    stretched = signer.sign(path, expires_at=past).replace(f"exp={past}", f"exp={later}")
    assert get(f"{served.remote}{stretched}").text == "bad signature\n"


def test_the_index_a_token_holder_reads_lists_signed_links_anyone_can_follow(served: Served) -> None:
    index = get(f"{served.remote}/", Authorization=f"Bearer {TOKEN}").text
    [href] = [part.split('"', 1)[0] for part in index.split('href="')[2:]]

    assert href.startswith(f"/a/{served.report.key}?sig=")
    assert get(f"{served.remote}{href.replace('&amp;', '&')}").content == b"<!doctype html><p>report</p>"


def test_without_token_or_secret_only_loopback_is_answered(tmp_path: Path) -> None:
    for server in start(tmp_path, {}):
        assert get(f"{server.local}/a/{server.log.key}").status_code == 200
        assert get(f"{server.remote}/a/{server.log.key}").status_code == 401
        # Without a secret no link is valid, whatever it carries; without a token no token is.
        signed = LinkSigner(SECRET).sign(f"/a/{server.log.key}")
        assert get(f"{server.remote}{signed}").text == "this server accepts no signed links\n"
        assert get(f"{server.remote}/", Authorization="Bearer anything").status_code == 403


def test_the_log_names_each_request_but_not_the_signature_that_opened_it(tmp_path: Path) -> None:
    for server in start(tmp_path, {"DURAFIX_EVIDENCE_LINK_SECRET": SECRET}):
        link = LinkSigner(SECRET).sign(f"/a/{server.log.key}", expires_at=int(time.time()) + 60)
        assert get(f"{server.remote}{link}").status_code == 200
        signature = link.split("sig=", 1)[1].split("&", 1)[0]

    assert f"/a/{server.log.key}?sig=redacted&exp=" in server.stderr
    assert signature not in server.stderr


def test_behind_a_local_reverse_proxy_loopback_can_be_made_to_need_credentials_too(tmp_path: Path) -> None:
    env = {"DURAFIX_EVIDENCE_TOKEN": TOKEN}
    for server in start(tmp_path, env, "--no-loopback-exemption"):
        assert get(f"{server.local}/a/{server.log.key}").status_code == 401
        assert get(f"{server.local}/a/{server.log.key}", Authorization=f"Bearer {TOKEN}").status_code == 200


def test_a_short_signing_secret_is_refused_at_start(tmp_path: Path) -> None:
    env = {**os.environ, "DURAFIX_EVIDENCE_LINK_SECRET": "short"}
    proc = subprocess.run(
        [sys.executable, "-m", "evidence.serve", "--root", str(tmp_path), "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )

    assert proc.returncode == 2
    assert "$DURAFIX_EVIDENCE_LINK_SECRET: a link-signing secret needs at least 16 bytes" in proc.stderr


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("192.0.2.2", False),
        ("::ffff:192.0.2.2", False),
        ("fd00::2", False),
        ("not an address", False),
    ],
)
def test_which_client_addresses_are_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_links_from_a_store_with_the_servers_secret_open_from_another_host(served: Served) -> None:
    # What the pipeline posts on a PR: the store's own links, signed with the secret the server checks.
    store = LocalArtifactStore(served.store.root, public_url=served.remote, signer=LinkSigner(SECRET))
    link = store.url_for(served.log)
    assert "sig=" in link
    assert get(link).content == b"the test log"
    unsigned = LocalArtifactStore(served.store.root, public_url=served.remote).url_for(served.log)
    assert get(unsigned).status_code == 401
