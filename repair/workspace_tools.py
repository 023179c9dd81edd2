"""File operations a model may perform, confined to one workspace.

Every path is relative to the workspace root. Refused, with :class:`ToolRefused`: absolute paths, any ``..``
component, anything inside ``.git`` (the repository's own state is not the model's to edit), and any path
that resolves outside the root once symlinks are followed. Files are read and written as UTF-8 text only, so a
patch built from the workspace never carries binary content.

The workspace is shared with sandboxed commands (the app keeps running while the model edits), so a path that
was checked may be swapped for a link before it is used: every read and write goes through
:mod:`environments.untrusted_files`, which opens each component with no link followed, so such a swap fails
the tool call instead of reaching a file of the worker's.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from browser.patterns import PatternError, compile_pattern
from environments.untrusted_files import UntrustedFileError, read_beneath, write_beneath

MAX_READ_BYTES = 200_000
MAX_LISTED = 500
MAX_SEARCH_HITS = 100


class ToolRefused(Exception):
    """A tool call the workspace will not perform; the message is shown to the model."""


class WorkspaceTools:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def resolve(self, path: str) -> Path:
        """The absolute path ``path`` names inside the workspace, or :class:`ToolRefused`."""
        pure = PurePosixPath(path)
        if pure.is_absolute():
            raise ToolRefused(f"{path!r}: absolute paths are refused; give a path relative to the repository root")
        if ".." in pure.parts:
            raise ToolRefused(f"{path!r}: '..' is refused; paths stay inside the repository")
        target = (self.root / pure).resolve()
        if target != self.root and self.root not in target.parents:
            raise ToolRefused(f"{path!r}: resolves outside the repository (through a symlink)")
        if any(part.lower() == ".git" for part in (*pure.parts, *target.relative_to(self.root).parts)):
            raise ToolRefused(f"{path!r}: the .git directory is off limits")
        return target

    def _rel(self, target: Path) -> str:
        return target.relative_to(self.root).as_posix()

    def _files(self, top: Path) -> list[str]:
        found: list[str] = []
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if d.lower() != ".git"]
            found.extend(self._rel(Path(dirpath) / name) for name in filenames)
        return sorted(found)

    def list_files(self, path: str) -> str:
        """Files under ``path`` (recursive, sorted, ``.git`` left out), one per line."""
        top = self.resolve(path)
        if not top.is_dir():
            raise ToolRefused(f"{path!r}: not a directory")
        found = self._files(top)
        listed = found[:MAX_LISTED]
        more = len(found) - len(listed)
        return "\n".join(listed + ([f"... and {more} more"] if more else [])) or "(no files)"

    def read_file(self, path: str) -> str:
        return self._read(self.resolve(path), path)

    def _read(self, target: Path, path: str) -> str:
        if not target.is_file():
            raise ToolRefused(f"{path!r}: no such file")
        size = target.stat().st_size
        if size > MAX_READ_BYTES:
            raise ToolRefused(f"{path!r}: {size} bytes is more than the {MAX_READ_BYTES} bytes a read returns")
        try:
            return read_beneath(self.root, self._rel(target), max_bytes=MAX_READ_BYTES).decode("utf-8")
        except UntrustedFileError as exc:
            raise ToolRefused(f"{path!r}: {str(exc).partition(': ')[2] or exc}") from None
        except UnicodeDecodeError:
            raise ToolRefused(f"{path!r}: not UTF-8 text") from None

    def _write(self, target: Path, path: str, text: str) -> None:
        try:
            write_beneath(self.root, self._rel(target), text.encode("utf-8"))
        except UntrustedFileError as exc:
            raise ToolRefused(f"{path!r}: {str(exc).partition(': ')[2] or exc}") from None

    def search(self, pattern: str) -> str:
        """Lines matching the regex ``pattern`` in the workspace's text files, as ``path:line: text``.

        The pattern is the model's, so it is untrusted like a procedure's: compiled and searched by RE2, in
        time linear in each line (:mod:`browser.patterns`), so no pattern can stall the worker."""
        try:
            regex = compile_pattern(pattern)
        except PatternError as e:
            raise ToolRefused(f"{pattern!r}: {e}") from None
        hits: list[str] = []
        for rel in self._files(self.root):
            target = self.root / rel
            # Symlinks are skipped: one may point outside the workspace.
            if target.is_symlink() or not target.is_file() or target.stat().st_size > MAX_READ_BYTES:
                continue
            try:
                lines = read_beneath(self.root, rel, max_bytes=MAX_READ_BYTES).decode("utf-8").splitlines()
            except (UntrustedFileError, UnicodeDecodeError):
                continue
            hits.extend(f"{rel}:{n}: {line}" for n, line in enumerate(lines, 1) if regex.search(line))
            if len(hits) >= MAX_SEARCH_HITS:
                return "\n".join([*hits[:MAX_SEARCH_HITS], f"... stopped at {MAX_SEARCH_HITS} matches"])
        return "\n".join(hits) or "(no matches)"

    def replace_in_file(self, path: str, old: str, new: str) -> str:
        """Replace ``old`` with ``new``; ``old`` must occur exactly once, so the edit means one thing."""
        if not old:
            raise ToolRefused("'old' must not be empty")
        target = self.resolve(path)
        text = self._read(target, path)
        count = text.count(old)
        if count != 1:
            raise ToolRefused(f"{path!r}: 'old' occurs {count} times; it must match exactly once")
        self._write(target, path, text.replace(old, new))
        return f"replaced 1 occurrence in {self._rel(target)}"

    def write_file(self, path: str, content: str) -> str:
        """Create or overwrite a text file (parent directories are created)."""
        target = self.resolve(path)
        if target == self.root or target.is_dir():
            raise ToolRefused(f"{path!r}: is a directory")
        self._write(target, path, content)
        return f"wrote {len(content.encode('utf-8'))} bytes to {self._rel(target)}"
