"""Reading files that untrusted code could have written: never through a link, never unbounded, never a FIFO.

Everything under a workspace or an agent's directory was writable by sandboxed code, so any path there may be a
symlink to the worker's secrets (``STATE/config.json``, ``/proc/self/environ``), a FIFO that blocks a reader
forever, a device, or a 10 GB sparse file. :func:`open_beneath` is the one way the worker opens such a file:

- the path is resolved *beneath* the given directory with no symlink followed at any component: the kernel's
  ``openat2(2)`` with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`` where it has it (Linux
  5.6+), else one ``openat(2)`` per component with ``O_NOFOLLOW`` (and ``O_DIRECTORY`` for every directory),
  refusing ``..`` and absolute paths; both are race-free: nothing is checked and then opened by name again;
- the open is non-blocking (a FIFO or a device never blocks it) and the opened object must be a regular file;
- a file larger than the cap is refused (:func:`read_beneath`) or read up to the cap and said to be cut
  (:func:`read_beneath` with ``truncate=True``), and reading stops at the cap even if the file grows meanwhile.

Failures raise :class:`UntrustedFileError`, whose message says which rule refused the file (for a step's
reason), and never quotes its content. Redaction of what is read is the caller's (each caller knows which
secrets apply: :mod:`environments.redaction`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO

# openat2(2): syscall number (the same on x86_64 and aarch64, which share the generic table since 5.6) and
# the RESOLVE_* flags of linux/openat2.h.
_SYS_OPENAT2 = 437
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_O_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | os.O_NOFOLLOW

DEFAULT_MAX_BYTES = 8 * 1024 * 1024


class UntrustedFileError(OSError):
    """A file under an untrusted directory was not read: missing, a link, not a regular file, or too big."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - every Linux has a libc
        return None


_LIBC = _libc()
# Set once openat2 answered ENOSYS (an older kernel, or a seccomp filter refusing it): the fallback from then on.
_openat2_missing = False


def _openat2(dir_fd: int, rel: str) -> int | None:
    """``openat2`` of ``rel`` beneath ``dir_fd`` with no symlink at all; ``None`` when the kernel lacks it."""
    global _openat2_missing
    if _openat2_missing or _LIBC is None:
        return None
    how = _OpenHow(_O_FLAGS, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    fd = int(_LIBC.syscall(_SYS_OPENAT2, dir_fd, os.fsencode(rel), ctypes.byref(how), ctypes.sizeof(how)))
    if fd >= 0:
        return fd
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EPERM) and not _probe_openat2():
        _openat2_missing = True
        return None
    raise OSError(err, os.strerror(err), rel)


def _probe_openat2() -> bool:
    """Whether openat2 works at all here (an EPERM from a seccomp filter looks like a refusal of one path)."""
    if _LIBC is None:
        return False
    how = _OpenHow(os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY, 0, 0)
    fd = int(_LIBC.syscall(_SYS_OPENAT2, -100, b"/", ctypes.byref(how), ctypes.sizeof(how)))
    if fd >= 0:
        os.close(fd)
        return True
    return False


def _parts(rel: str | PurePosixPath) -> list[str]:
    text = str(rel)
    pure = PurePosixPath(text)
    if not text or pure.is_absolute():
        raise UntrustedFileError(f"{text!r}: not a path inside the directory")
    parts = [part for part in pure.parts if part not in ("", ".")]
    if not parts or ".." in parts:
        raise UntrustedFileError(f"{text!r}: leads outside the directory")
    return parts


@contextlib.contextmanager
def _parent(root: Path, parts: list[str], *, make: bool = False) -> Iterator[int]:
    """A descriptor of the directory holding ``parts[-1]`` beneath ``root``, each directory on the way opened
    with ``O_NOFOLLOW`` (a link anywhere fails with ELOOP/ENOTDIR); with ``make``, missing ones are created."""
    current = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=current)
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
            os.close(current)
            current = nxt
        yield current
    finally:
        os.close(current)


def open_fd_beneath(root: Path, rel: str | PurePosixPath) -> int:
    """A read-only descriptor of the regular file ``rel`` beneath ``root``, no link followed (see module doc).

    ``root`` itself is the worker's choice (a workspace, an agent directory) and is opened normally; it must be
    a directory. Raises :class:`UntrustedFileError` saying why the file was refused."""
    parts = _parts(rel)
    if not root.is_dir():
        raise UntrustedFileError(f"{root}: not a directory that can be opened")
    try:
        with _parent(root, []) as root_fd:
            fd = _openat2(root_fd, "/".join(parts))
        if fd is None:
            with _parent(root, parts) as parent:
                fd = os.open(parts[-1], _O_FLAGS, dir_fd=parent)
    except OSError as exc:
        raise UntrustedFileError(_refusal(str(rel), exc)) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UntrustedFileError(f"{rel}: not a regular file ({_kind(st.st_mode)}); it is not read")
    # Back to blocking reads: a regular file never blocks, and O_NONBLOCK only mattered for the open.
    os.set_blocking(fd, True)
    return fd


@contextlib.contextmanager
def open_beneath(root: Path, rel: str | PurePosixPath) -> Iterator[BinaryIO]:
    """:func:`open_fd_beneath` as a binary file object, closed with the block."""
    fh = os.fdopen(open_fd_beneath(root, rel), "rb")
    try:
        yield fh
    finally:
        fh.close()


def read_beneath(
    root: Path, rel: str | PurePosixPath, *, max_bytes: int = DEFAULT_MAX_BYTES, truncate: bool = False
) -> bytes:
    """The bytes of the regular file ``rel`` beneath ``root`` (see the module docstring).

    A file over ``max_bytes`` raises :class:`UntrustedFileError`, or with ``truncate`` yields its first
    ``max_bytes`` bytes (:func:`read_beneath_cut` says whether it was cut). Never reads more than
    ``max_bytes + 1`` bytes, whatever the file's size or growth."""
    data, cut = read_beneath_cut(root, rel, max_bytes=max_bytes)
    if cut and not truncate:
        raise UntrustedFileError(f"{rel}: larger than the {max_bytes}-byte limit; it is not read")
    return data


def read_beneath_cut(root: Path, rel: str | PurePosixPath, *, max_bytes: int) -> tuple[bytes, bool]:
    """The first ``max_bytes`` bytes of ``rel`` beneath ``root``, and whether the file held more."""
    with open_beneath(root, rel) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > max_bytes:
            return fh.read(max_bytes), True
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        return data[:max_bytes], True
    return data, False


def copy_beneath(root: Path, rel: str | PurePosixPath, dest: Path, *, max_bytes: int) -> bool:
    """Copy the regular file ``rel`` beneath ``root`` to ``dest`` (a path of the worker's), at most
    ``max_bytes`` of it; answers whether it was cut. ``dest`` is created new (never through a link)."""
    with open_beneath(root, rel) as src:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out:
            left = max_bytes
            while left > 0:
                chunk = src.read(min(left, 1 << 20))
                if not chunk:
                    return False
                out.write(chunk)
                left -= len(chunk)
            return bool(src.read(1))


def write_beneath(root: Path, rel: str | PurePosixPath, data: bytes, *, make_parents: bool = True) -> None:
    """Create or overwrite the regular file ``rel`` beneath ``root`` with ``data``, following no link: every
    parent directory is opened (or, with ``make_parents``, created) with ``O_NOFOLLOW``, and the file itself is
    opened with ``O_NOFOLLOW``, so a link planted anywhere on the way fails the write instead of redirecting it
    out of ``root``. A FIFO or device there is refused, not opened for writing."""
    parts = _parts(rel)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        with _parent(root, parts, make=make_parents) as parent:
            fd = os.open(parts[-1], flags, 0o644, dir_fd=parent)
    except OSError as exc:
        raise UntrustedFileError(_refusal(str(rel), exc)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedFileError(f"{rel}: not a regular file ({_kind(st.st_mode)}); it is not written")
        os.set_blocking(fd, True)
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def unlink_beneath(root: Path, rel: str | PurePosixPath) -> None:
    """Remove the file or link ``rel`` beneath ``root`` if present, following no link on the way to it (a link
    itself is removed, never its target); a directory there, or a path through a link, is left alone."""
    parts = _parts(rel)
    try:
        with _parent(root, parts) as parent:
            os.unlink(parts[-1], dir_fd=parent)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EISDIR, errno.EPERM):
            raise


def _refusal(rel: str, exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return f"{rel}: was not written"
    if exc.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
        return f"{rel}: is a link or leads through one (or outside the directory); it is not read"
    return f"{rel}: could not be opened ({exc.strerror})"


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"
