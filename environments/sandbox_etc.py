"""The ``/etc`` a sandboxed command sees: a read-only tmpfs holding only :data:`CURATED_ETC`, each entry bound
read-only from the host where it exists, and ``passwd``/``group`` stubs the worker writes itself.

The host's ``/etc`` holds what no repository may read: ``shadow-``, TLS and SSH private keys
(``/etc/ssl/private``, ``/etc/ssh/ssh_host_*_key``), a Docker daemon's ``key.json``, and whatever an operator
mounts there (``docs/deploy.md`` puts the Temporal and GitHub App keys under ``/etc/durafix/``). The sandbox keeps
the worker's uid, so file permissions protect none of it: only not being mounted does. Hence an allow-list, not a
deny-list: a file not named here does not exist inside.

How an entry is bound (:func:`etc_args`): a directory or file is bound read-only at the same path under ``/etc``
(symlinks inside it resolve inside the sandbox: ``/etc/ssl/certs/*.pem -> /usr/share/ca-certificates/...``
works because ``/usr`` is there too). An entry that is itself a symlink is recreated as the same symlink when its
target is visible inside anyway (``/etc/localtime -> /usr/share/zoneinfo/...``, ``/etc/mtab -> ../proc/...``),
else the file it resolves to on the host is bound in its place (``/etc/resolv.conf`` pointing into ``/run``, which
is private inside). :func:`etc_sources` lists the host paths whose content ends up visible, for the worker's
start-up check (``Sandbox.exposes``).

The stubs (:func:`account_stubs`): ``passwd`` with root, nobody and the worker's own uid; ``group`` with root,
nogroup and the worker's own gid; no other account of the host. They live in a directory of the worker's own
(``mkdtemp``, mode 0700), never in a workspace, and are rewritten when something (a temp cleaner) removed them.
"""

from __future__ import annotations

import atexit
import grp
import os
import pwd
import shutil
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

ETC = Path("/etc")

# What a toolchain reads under /etc, relative to it; ``*`` matches within one name. Each entry says why it is
# there. Not here on purpose: shadow files, ssl/private, ssh, docker, the operator's own directories, gitconfig
# (a system git config names credential helpers and can carry tokens), profile, profile.d, environment,
# bash.bashrc (read by login or interactive shells only, and a place operators export secrets from),
# login.defs, pam.d, sudoers (account tools that cannot work inside anyway), machine-id and hostname (they
# identify the host, and nothing a build runs needs them).
CURATED_ETC: tuple[tuple[str, str], ...] = (
    ("resolv.conf", "the DNS servers: setup with the network resolves the package index's host"),
    ("hosts", "localhost and the host's static names, read by every resolver"),
    ("nsswitch.conf", "where glibc looks names, users and groups up (files: the stubs below)"),
    ("host.conf", "glibc's resolver options"),
    ("gai.conf", "getaddrinfo's address ordering (IPv4 or IPv6 first)"),
    ("protocols", "protocol names (getprotobyname: Python's socket module, Node's net)"),
    ("services", "service names and ports (getservbyname: 'http' -> 80)"),
    ("ssl/certs", "the CA certificates (ca-certificates.crt, the hashed links, Java's cacerts)"),
    ("ssl/openssl.cnf", "OpenSSL's configuration (/usr/lib/ssl/openssl.cnf links here)"),
    ("ca-certificates", "update hooks of the CA bundle (read by tools that check the bundle's origin)"),
    ("ca-certificates.conf", "which CA certificates the bundle holds"),
    ("ld.so.conf", "the dynamic linker's library directories"),
    ("ld.so.conf.d", "the directories ld.so.conf includes (multiarch: /usr/lib/x86_64-linux-gnu)"),
    ("ld.so.cache", "the dynamic linker's cache: without it libraries in multiarch directories are not found"),
    ("alternatives", "Debian's alternatives links (/usr/bin/java, /usr/bin/editor -> /etc/alternatives/...)"),
    ("localtime", "the system time zone (a link into /usr/share/zoneinfo)"),
    ("timezone", "the system time zone's name"),
    ("mime.types", "file types by extension (Python's mimetypes, web servers a test starts)"),
    ("os-release", "which distribution this is (pip, npm and Node's build tools read it)"),
    ("debian_version", "Debian's release (read by build scripts that special-case it)"),
    ("mtab", "the mount table link (../proc/self/mounts: df, findmnt, Node's os module)"),
    ("python3*", "Debian Python's site configuration (python3.X/sitecustomize.py is linked from /usr/lib)"),
    ("pip.conf", "pip's site-wide index and certificate settings (its find-links and indexes)"),
    ("xdg/pip", "pip's site-wide settings in the XDG location (pip.conf, constraints)"),
    ("npmrc", "npm's global settings (its registry and certificate file)"),
    ("java-*", "the JDK's configuration (/usr/lib/jvm/*/conf links here: java.security, jvm.cfg)"),
    ("maven", "Maven's settings (/usr/share/maven/conf links here)"),
    ("fonts", "fontconfig's configuration, for tests that render text (PDFs, images, headless browsers)"),
)
# Written by the worker (account_stubs), never bound from the host.
STUB_FILES = ("passwd", "group")
# Read-only once every entry (and anything bound under /etc after them) has its mount point.
REMOUNT_ETC = ("--remount-ro", str(ETC))


def etc_entries(etc: Path = ETC) -> list[Path]:
    """The host paths of :data:`CURATED_ETC` that exist here (globs expanded; a dangling link included), in
    the list's order."""
    found: list[Path] = []
    for name, _why in CURATED_ETC:
        matches = sorted(etc.glob(name)) if "*" in name else [etc / name]
        found += [path for path in matches if os.path.lexists(path) and path not in found]
    return found


def _under(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def _bound_in_place(entry: Path, visible_roots: Sequence[Path]) -> bool:
    """Whether ``entry`` is a link to recreate as a link: its target is visible inside anyway."""
    return entry.is_symlink() and _under(entry.resolve(), visible_roots)


def etc_sources(visible_roots: Sequence[Path], etc: Path = ETC) -> list[Path]:
    """The host paths (resolved) whose content a sandboxed command can read under ``/etc``: each entry bound
    (a directory with everything under it), not the links recreated as links (their targets are under
    ``visible_roots``, the other things the sandbox binds), nor the stubs."""
    return [
        entry.resolve()
        for entry in etc_entries(etc)
        if not _bound_in_place(entry, visible_roots) and entry.resolve().exists()
    ]


def etc_args(stubs: Path, visible_roots: Sequence[Path], etc: Path = ETC) -> list[str]:
    """bwrap arguments building the sandbox's ``/etc`` (see the module); ``stubs`` holds :data:`STUB_FILES`,
    ``visible_roots`` what else the sandbox binds (``/usr``, ``/proc``). The caller adds :data:`REMOUNT_ETC`
    after its last mount under ``/etc``."""
    args = ["--tmpfs", str(etc)]
    made: set[Path] = {etc}
    for entry in etc_entries(etc):
        inside = ETC / entry.relative_to(etc)
        # bwrap would create missing parents mode 0700; make them as /etc's own are.
        for parent in reversed(inside.parents):
            if parent not in made and parent.is_relative_to(ETC):
                args += ["--dir", str(parent)]
                made.add(parent)
        if _bound_in_place(entry, visible_roots):
            args += ["--symlink", str(entry.readlink()), str(inside)]
        elif entry.resolve().exists():
            # A link whose target is not visible inside: bind what it resolves to on the host.
            args += ["--ro-bind", str(entry.resolve()), str(inside)]
        made.add(inside)
    for name in STUB_FILES:
        args += ["--ro-bind", str(stubs / name), str(ETC / name)]
    return args


def _account(name: str, fallback: str) -> str:
    """A host account name fit for a passwd line, else ``fallback``."""
    return name if name and not any(c in name for c in ":\n") else fallback


def stub_texts(uid: int, gid: int) -> dict[str, str]:
    """``passwd`` and ``group`` for a sandbox run by ``uid``/``gid``: root, nobody/nogroup and that uid/gid
    (named as on the host, else ``durafix``), nothing else of the host's accounts."""
    passwd = ["root:x:0:0:root:/root:/bin/sh", "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin"]
    group = ["root:x:0:", "nogroup:x:65534:"]
    if uid not in (0, 65534):
        try:
            user = pwd.getpwuid(uid)
            name, home = _account(user.pw_name, "durafix"), _account(user.pw_dir, "/nonexistent")
        except KeyError:
            name, home = "durafix", "/nonexistent"
        passwd.append(f"{name}:x:{uid}:{gid}:{name}:{home}:/bin/sh")
    if gid not in (0, 65534):
        try:
            group_name = _account(grp.getgrgid(gid).gr_name, "durafix")
        except KeyError:
            group_name = "durafix"
        group.append(f"{group_name}:x:{gid}:")
    return {"passwd": "\n".join(passwd) + "\n", "group": "\n".join(group) + "\n"}


_lock = threading.Lock()
_stub_dir: Path | None = None


def account_stubs() -> Path:
    """The worker's directory holding :data:`STUB_FILES` for its uid/gid (created on first use, mode 0700;
    written again when a file is missing). Shared by every sandbox of this process; removed when it exits (a
    sandbox still running keeps the files it mounted)."""
    global _stub_dir
    with _lock:
        directory = _stub_dir
        if directory is None or not all((directory / name).is_file() for name in STUB_FILES):
            if directory is None or not directory.is_dir():
                directory = Path(tempfile.mkdtemp(prefix="durafix-sandbox-etc-"))
                atexit.register(_remove, directory, os.getpid())
            for name, text in stub_texts(os.getuid(), os.getgid()).items():
                tmp = directory / f".{name}.tmp"
                tmp.write_text(text)
                tmp.chmod(0o644)
                tmp.replace(directory / name)
            _stub_dir = directory
        return directory


def _remove(directory: Path, owner: int) -> None:
    # Only the process that made it: a forked child exiting through Python must not take its parent's stubs.
    if os.getpid() == owner:
        shutil.rmtree(directory, ignore_errors=True)
