"""The sandbox's curated ``/etc`` against real bubblewrap, and the worker refusing to start with a secret file a
sandboxed command could read.

A command in the sandbox lists and reads ``/etc`` as hostile code would: only :data:`CURATED_ETC` and the
worker's ``passwd``/``group`` stubs are there, nothing the host keeps beside them (``shadow-``, ``ssl/private``,
``ssh``, ``docker``, a key planted under ``/etc/durafix/`` for the test), while the links a toolchain follows
(CA certificates, the time zone, alternatives) still resolve and TLS, name lookups and the account stubs work.
The real ``durafix worker`` refuses (exit 2, naming the setting and the file) a key under a path the sandbox
mounts, before it reaches Temporal: a listener at the configured address sees no connection.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from environments.sandbox import Sandbox
from environments.sandbox_etc import CURATED_ETC, STUB_FILES, account_stubs, etc_entries, stub_texts
from pipeline.config import DurafixConfig
from pipeline.worker.sandbox_exposure import exposures
from tests.conftest import require
from tests.support.sandbox import sandbox

# Host files no sandboxed command may see; each one present on the host is asserted absent inside.
FORBIDDEN = (
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "passwd-",
    "group-",
    "ssl/private",
    "ssh",
    "docker",
    "gitconfig",
    "sudoers",
    "machine-id",
    "profile",
    "environment",
)


__all__ = ["sandbox"]


def inside(sandbox: Sandbox, workspace: Path, script: str) -> subprocess.CompletedProcess[str]:
    """``script`` run by ``sh`` in the sandbox, with the environment a step gets."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    argv = sandbox.wrap(["/bin/sh", "-c", script], workspace=workspace)
    return subprocess.run(argv, cwd=workspace, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def planted_key() -> Iterator[tuple[Path, str]]:
    """``/etc/durafix/test-key.pem`` on the host, holding a distinctive marker; removed (with the directory, if
    the test made it) afterwards."""
    directory = Path("/etc/durafix")
    require(os.access("/etc", os.W_OK), "planting a key under /etc needs a worker that may write /etc (root)")
    made = not directory.exists()
    directory.mkdir(exist_ok=True)
    key = directory / "test-key.pem"
    require(not key.exists(), f"{key} exists already: not overwriting it")
    marker = f"PLANTED-KEY-{uuid.uuid4().hex}"
    key.write_text(f"-----BEGIN PRIVATE KEY-----\n{marker}\n-----END PRIVATE KEY-----\n")
    key.chmod(0o600)
    try:
        yield key, marker
    finally:
        key.unlink()
        if made:
            directory.rmdir()


def test_etc_inside_holds_only_the_curated_entries_and_the_account_stubs(sandbox: Sandbox, tmp_path: Path) -> None:
    listed = inside(sandbox, tmp_path, "ls -A /etc")
    assert listed.returncode == 0, listed.stderr
    names = set(listed.stdout.split())
    patterns = {name.split("/")[0] for name, _why in CURATED_ETC}
    # Every name inside is one the list allows, and each curated entry present on the host is there.
    assert all(any(fnmatch.fnmatch(n, p) for p in patterns) or n in STUB_FILES for n in names), names
    assert names == {str(e.relative_to("/etc")).split("/")[0] for e in etc_entries()} | set(STUB_FILES)
    assert not names & {name for name in FORBIDDEN if "/" not in name}, names

    # Recursively: every path under /etc is a curated entry, below one, or a directory leading to one.
    allowed = [f"/etc/{e.relative_to('/etc')}" for e in etc_entries()] + [f"/etc/{s}" for s in STUB_FILES]
    parents = {str(p) for a in allowed for p in Path(a).parents}
    found = inside(sandbox, tmp_path, "find /etc")
    assert found.returncode == 0, found.stderr
    paths = found.stdout.split("\n")[:-1]
    assert len(paths) > len(allowed)  # the bound directories' contents are listed too
    for path in paths:
        assert path in parents or any(path == a or path.startswith(a + "/") for a in allowed), path


def test_no_secret_of_the_hosts_etc_is_readable_inside(
    sandbox: Sandbox, tmp_path: Path, planted_key: tuple[Path, str]
) -> None:
    key, marker = planted_key
    present = [name for name in FORBIDDEN if os.path.lexists(f"/etc/{name}")]
    assert "shadow-" in present or "shadow" in present, "the host has no shadow file to hide"
    probes = " ".join(f"/etc/{name}" for name in present)
    result = inside(
        sandbox,
        tmp_path,
        f"cat {key} 2>&1; ls -la /etc/durafix 2>&1; cat /etc/ssl/certs/../private/* 2>&1; "
        f"for f in {probes}; do if [ -e $f ] || [ -L $f ]; then echo VISIBLE $f; else echo absent $f; fi; done; "
        "grep -rl PLANTED-KEY /etc 2>/dev/null; echo searched",
    )
    out = result.stdout
    assert marker not in out and "PRIVATE KEY" not in out, out
    assert f"cat: {key}: No such file or directory" in out
    assert "VISIBLE" not in out, out
    assert out.count("absent") == len(present) and "searched" in out
    # And the host's key is untouched by all that.
    assert marker in key.read_text()


def test_the_links_a_toolchain_follows_resolve_and_tls_names_and_accounts_work(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    result = inside(
        sandbox,
        tmp_path,
        "find -L /etc/ssl/certs /etc/localtime /etc/os-release -type l; echo broken-links-above; "
        "readlink /etc/localtime; date +%Z; "
        "python3 -c \"import ssl; c = ssl.create_default_context(); print('cas', c.cert_store_stats()['x509_ca'])\"; "
        'python3 -c "import socket, mimetypes; '
        "print(socket.getservbyname('https'), mimetypes.guess_type('a.json')[0])\"; "
        "getent hosts localhost; getent passwd | cut -d: -f1,3; id -un",
    )
    assert result.returncode == 0, result.stderr
    broken, rest = result.stdout.split("broken-links-above\n", 1)
    assert broken == "", f"links that do not resolve inside: {broken}"
    lines = rest.splitlines()
    assert lines[0] == os.readlink("/etc/localtime") and lines[1]
    assert lines[2].startswith("cas ") and int(lines[2].split()[1]) > 10  # the system CA bundle loads
    assert lines[3] == "443 application/json"
    assert "localhost" in lines[4]
    accounts = {line.split(":")[0]: int(line.split(":")[1]) for line in lines[5:-1]}
    uid = os.getuid()
    # root, nobody and the worker's own uid (root here when the worker runs as root): no other account.
    assert accounts["root"] == 0 and accounts["nobody"] == 65534, accounts
    assert sorted(accounts.values()) == sorted({0, 65534, uid}), accounts
    assert lines[-1] == next(name for name, n in accounts.items() if n == uid)


def test_the_stubs_name_only_root_nobody_and_the_workers_own_ids() -> None:
    texts = stub_texts(4321, 8765)
    users = [line.split(":") for line in texts["passwd"].splitlines()]
    groups = [line.split(":") for line in texts["group"].splitlines()]
    assert [(u[0], u[2], u[3]) for u in users][:2] == [("root", "0", "0"), ("nobody", "65534", "65534")]
    assert [(u[2], u[3]) for u in users][2:] == [("4321", "8765")]
    assert [(g[0], g[2]) for g in groups][:2] == [("root", "0"), ("nogroup", "65534")]
    assert [g[2] for g in groups][2:] == ["8765"]
    assert len(stub_texts(0, 0)["passwd"].splitlines()) == 2


def test_the_stubs_are_written_again_when_something_removed_them() -> None:
    # A temp cleaner on a long-running worker: the next sandbox must still find its passwd and group.
    first = account_stubs()
    assert (first / "passwd").read_text() == stub_texts(os.getuid(), os.getgid())["passwd"]
    assert first.stat().st_mode & 0o777 == 0o700
    shutil.rmtree(first)
    again = account_stubs()
    assert all((again / name).is_file() for name in STUB_FILES)
    assert (again / "group").read_text() == stub_texts(os.getuid(), os.getgid())["group"]


@pytest.fixture
def temporal_stand_in() -> Iterator[tuple[str, list[bytes]]]:
    """A TCP listener where the worker is told Temporal is; it records every connection."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    sock.settimeout(0.2)
    seen: list[bytes] = []
    yield f"127.0.0.1:{sock.getsockname()[1]}", seen
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            break
        seen.append(b"connected")
        conn.close()
    sock.close()


def durafix_worker(state: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The installed ``durafix worker`` with only ``env`` (and PATH) as its configuration."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(state), "DURAFIX_STATE_DIR": str(state)}
    return subprocess.run(
        [str(Path(sys.executable).parent / "durafix"), "worker", *args],
        env={**base, **env},
        cwd=state,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_worker_refuses_to_start_with_a_key_file_the_sandbox_mounts_before_reaching_temporal(
    tmp_path: Path, temporal_stand_in: tuple[str, list[bytes]]
) -> None:
    address, seen = temporal_stand_in
    state = tmp_path / "state"
    state.mkdir()
    # An extra read-only path of the sandbox (a shell agent CLI's directory) holding the App's key.
    tools = tmp_path / "agent-tools"
    tools.mkdir()
    app_key = tools / "app-private-key.pem"
    app_key.write_text("-----BEGIN PRIVATE KEY-----\nnot-a-real-key\n-----END PRIVATE KEY-----\n")
    # A Temporal key given by a link into /usr: bwrap binds what a path resolves to, so /usr shows it.
    usr_file = Path("/usr/share/common-licenses/GPL-3")
    require(usr_file.is_file(), f"{usr_file} is missing")
    tls_key = tmp_path / "client.key"
    tls_key.symlink_to(usr_file)
    env = {
        "DURAFIX_TEMPORAL_ADDRESS": address,
        "DURAFIX_ENGINE_PATHS": str(tools),
        "DURAFIX_GITHUB_APP_ID": "1234",
        "DURAFIX_GITHUB_APP_PRIVATE_KEY_FILE": str(app_key),
        "DURAFIX_TEMPORAL_TLS_KEY": str(tls_key),
        "DURAFIX_TEMPORAL_TLS_CERT": str(tmp_path / "client.pem"),
    }
    refused = durafix_worker(state, env, "--queues", "orchestration")
    assert refused.returncode == 2, refused.stderr
    assert "worker not started" in refused.stderr
    assert f"DURAFIX_GITHUB_APP_PRIVATE_KEY_FILE={app_key} is readable inside the sandbox" in refused.stderr
    assert f"(it is under {tools}," in refused.stderr
    assert f"DURAFIX_TEMPORAL_TLS_KEY={tls_key} is readable inside the sandbox" in refused.stderr
    assert "(it is under /usr," in refused.stderr
    assert "not-a-real-key" not in refused.stderr + refused.stdout
    # The certificate (not under anything mounted) is not named.
    assert "DURAFIX_TEMPORAL_TLS_CERT" not in refused.stderr

    checked = durafix_worker(state, env, "--check", "--queues", "orchestration")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert f"sandbox: DURAFIX_GITHUB_APP_PRIVATE_KEY_FILE={app_key} is readable" in checked.stdout
    assert f"sandbox: DURAFIX_TEMPORAL_TLS_KEY={tls_key} is readable" in checked.stdout
    assert seen == [], "the worker reached the Temporal address before refusing"


def test_a_key_outside_what_the_sandbox_mounts_is_accepted(
    sandbox: Sandbox, tmp_path: Path, planted_key: tuple[Path, str], temporal_stand_in: tuple[str, list[bytes]]
) -> None:
    key, marker = planted_key
    address, seen = temporal_stand_in
    state = tmp_path / "state"
    state.mkdir()
    env = {"DURAFIX_TEMPORAL_ADDRESS": address, "DURAFIX_TEMPORAL_TLS_KEY": str(key)}
    checked = durafix_worker(state, env, "--check", "--queues", "orchestration")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "sandbox:" not in checked.stdout and marker not in checked.stdout
    config = DurafixConfig(state_dir=state, temporal_tls_key=str(key), github_app_private_key_file=str(key))
    assert exposures(config) == [] and sandbox.exposes(key) is None
    assert seen == []


def test_a_state_directory_under_a_mounted_path_is_refused(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    config = DurafixConfig(state_dir=tools / "state", engine_paths=[str(tools)])
    [exposure] = exposures(config)
    assert (exposure.setting, exposure.path, exposure.under) == ("DURAFIX_STATE_DIR", str(tools / "state"), str(tools))
    # The external engine's install directory is mounted too.
    engine = DurafixConfig(state_dir=tmp_path / "s", engine="command", tools_dir=str(tmp_path / "t"))
    key = tmp_path / "t" / "key.pem"
    assert [e.setting for e in exposures(engine.model_copy(update={"temporal_api_key_file": str(key)}))] == [
        "DURAFIX_TEMPORAL_API_KEY_FILE"
    ]
