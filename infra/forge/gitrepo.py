"""Git plumbing on one bare repository, through the git CLI.

Ref writes are compare-and-swap (``git update-ref REF NEW OLD``): a create fails if the ref exists and an
update fails if the ref moved since it was read, so concurrent pushes and API calls never lose an update.
Git's own config files are ignored so the host's settings cannot change what the forge does.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ZERO_SHA = "0" * 40

GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}


class GitError(Exception):
    """A git plumbing command failed; the message carries its stderr."""


@dataclass(frozen=True)
class Identity:
    name: str
    email: str
    date: str  # ISO 8601, UTC

    def env(self, role: str) -> dict[str, str]:
        return {f"GIT_{role}_NAME": self.name, f"GIT_{role}_EMAIL": self.email, f"GIT_{role}_DATE": self.date}


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    tree: str
    parents: list[str]
    author: Identity
    committer: Identity
    message: str


@dataclass(frozen=True)
class TreeEntry:
    mode: str
    type: str
    sha: str
    size: int | None
    path: str


@dataclass(frozen=True)
class FileChange:
    filename: str
    status: str
    additions: int
    deletions: int


def _parse_identity(line: str) -> Identity:
    # "Name <email> 1700000000 +0000"
    head, _, rest = line.rpartition(">")
    name, _, email = head.partition("<")
    stamp = rest.split()[0] if rest.split() else "0"
    date = datetime.fromtimestamp(int(stamp), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Identity(name.strip(), email.strip(), date)


class GitRepo:
    def __init__(self, path: Path) -> None:
        self.path = path

    def run(self, *args: str, data: bytes | None = None, env: dict[str, str] | None = None) -> bytes:
        proc = subprocess.run(
            ["git", f"--git-dir={self.path}", *args],
            input=data,
            capture_output=True,
            env={**os.environ, **GIT_ENV, **(env or {})},
            check=False,
        )
        if proc.returncode != 0:
            raise GitError(f"git {args[0]} failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
        return proc.stdout

    def _ok(self, *args: str) -> bool:
        proc = subprocess.run(
            ["git", f"--git-dir={self.path}", *args],
            capture_output=True,
            env={**os.environ, **GIT_ENV},
            check=False,
        )
        return proc.returncode == 0

    def init_bare(self, default_branch: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["git", "init", "--bare", "--quiet", f"--initial-branch={default_branch}", str(self.path)],
            check=True,
            capture_output=True,
            env={**os.environ, **GIT_ENV},
        )
        # Pushes of many small objects stay loose otherwise; the server keeps them as packs like GitHub.
        self.run("config", "receive.unpackLimit", "100")
        self.run("config", "http.receivepack", "true")

    def object_type(self, sha: str) -> str | None:
        if not sha or not all(c in "0123456789abcdef" for c in sha.lower()):
            return None
        try:
            return self.run("cat-file", "-t", sha).decode().strip()
        except GitError:
            return None

    def resolve_commit(self, rev: str) -> str | None:
        """A commit SHA for a full/short SHA, branch or ref; None when nothing matches."""
        if rev.startswith("-"):
            return None
        try:
            return (
                self.run("rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}").decode().strip()
            )
        except GitError:
            return None

    def is_empty(self) -> bool:
        """Whether the repository has no refs at all: nothing was ever pushed or committed (GitHub's "empty")."""
        return not self.run("for-each-ref", "--count=1", "--format=%(refname)").strip()

    def read_ref(self, ref: str) -> str | None:
        return self.list_refs(ref, exact=True).get(ref)

    def list_refs(self, prefix: str = "refs/", exact: bool = False) -> dict[str, str]:
        out = self.run("for-each-ref", "--format=%(objectname) %(refname)", prefix).decode()
        refs: dict[str, str] = {}
        for line in out.splitlines():
            sha, _, name = line.partition(" ")
            if not exact or name == prefix:
                refs[name] = sha
        return refs

    def update_ref(self, ref: str, new: str, old: str | None) -> bool:
        """Move ``ref`` to ``new`` only if it is still at ``old`` (``None``: only if it does not exist)."""
        return self._ok("update-ref", "--no-deref", ref, new, old if old is not None else "")

    def delete_ref(self, ref: str, old: str) -> bool:
        return self._ok("update-ref", "--no-deref", "-d", ref, old)

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        return self._ok("merge-base", "--is-ancestor", ancestor, descendant)

    def merge_base(self, a: str, b: str) -> str | None:
        try:
            return self.run("merge-base", a, b).decode().strip() or None
        except GitError:
            return None

    def hash_blob(self, data: bytes) -> str:
        return self.run("hash-object", "-w", "-t", "blob", "--stdin", data=data).decode().strip()

    def cat(self, kind: str, sha: str) -> bytes:
        return self.run("cat-file", kind, sha)

    def commit_info(self, sha: str) -> CommitInfo:
        raw = self.cat("commit", sha).decode(errors="replace")
        header, _, message = raw.partition("\n\n")
        tree = ""
        parents: list[str] = []
        author = committer = Identity("", "", "")
        for line in header.splitlines():
            key, _, value = line.partition(" ")
            if key == "tree":
                tree = value
            elif key == "parent":
                parents.append(value)
            elif key == "author":
                author = _parse_identity(value)
            elif key == "committer":
                committer = _parse_identity(value)
        return CommitInfo(sha, tree, parents, author, committer, message)

    def ls_tree(self, tree: str, recursive: bool) -> list[TreeEntry]:
        args = ["ls-tree", "-l", "-z"] + (["-r", "-t"] if recursive else []) + [tree]
        entries = []
        for record in self.run(*args).decode(errors="replace").split("\0"):
            if not record:
                continue
            meta, _, path = record.partition("\t")
            mode, kind, sha, size = meta.split()
            entries.append(TreeEntry(mode, kind, sha, None if size == "-" else int(size), path))
        return entries

    def build_tree(self, base_tree: str | None, changes: list[tuple[str, str, str | None]]) -> str:
        """Write a tree: ``base_tree`` (or empty) with each ``(path, mode, sha)`` set, or removed when sha is None.

        Setting a path replaces whatever was there, a file or a whole directory; a ``040000`` entry grafts a
        tree. Works without a work tree: the new index is written from scratch into a temporary file.
        """
        files = (
            {e.path: (e.mode, e.sha) for e in self.ls_tree(base_tree, recursive=True) if e.type != "tree"}
            if (base_tree)
            else {}
        )
        for path, mode, sha in changes:
            parents = {path.rsplit("/", i)[0] for i in range(1, path.count("/") + 1)}
            for existing in [p for p in files if p == path or p.startswith(path + "/") or p in parents]:
                del files[existing]
            if sha is None:
                continue
            if mode == "040000":
                for e in self.ls_tree(sha, recursive=True):
                    if e.type != "tree":
                        files[f"{path}/{e.path}"] = (e.mode, e.sha)
            else:
                files[path] = (mode, sha)
        index_info = "".join(f"{mode} {sha}\t{path}\0" for path, (mode, sha) in files.items())
        with tempfile.TemporaryDirectory() as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            self.run("update-index", "-z", "--index-info", data=index_info.encode(), env=env)
            return self.run("write-tree", env=env).decode().strip()

    def commit_tree(self, tree: str, parents: list[str], message: str, author: Identity, committer: Identity) -> str:
        args = ["commit-tree", tree]
        for parent in parents:
            args += ["-p", parent]
        env = {**author.env("AUTHOR"), **committer.env("COMMITTER")}
        return self.run(*args, data=message.encode(), env=env).decode().strip()

    def merge_tree(self, ours: str, theirs: str) -> tuple[bool, str | None]:
        """A real three-way merge without a work tree: ``(clean, tree)``; tree is None on conflict."""
        proc = subprocess.run(
            ["git", f"--git-dir={self.path}", "merge-tree", "--write-tree", "--no-messages", ours, theirs],
            capture_output=True,
            env={**os.environ, **GIT_ENV},
            check=False,
        )
        if proc.returncode == 0:
            return True, proc.stdout.decode().split()[0]
        if proc.returncode == 1:
            return False, None
        raise GitError(f"git merge-tree failed: {proc.stderr.decode(errors='replace')}")

    def rev_list(self, include: str, exclude: str | None = None, limit: int | None = None) -> list[str]:
        args = ["rev-list", "--topo-order"]
        if limit is not None:
            args.append(f"--max-count={limit}")
        args.append(include)
        if exclude and exclude != ZERO_SHA:
            args.append(f"^{exclude}")
        return self.run(*args).decode().split()

    def changes(self, old: str | None, new: str) -> list[FileChange]:
        """Files changed from ``old`` (or from nothing) to ``new``, with line counts."""
        base = old or self.run("hash-object", "-t", "tree", os.devnull).decode().strip()
        numstat = self.run("diff-tree", "-r", "-z", "--no-renames", "--numstat", base, new).decode(errors="replace")
        status = self.run("diff-tree", "-r", "-z", "--no-renames", "--name-status", base, new).decode(errors="replace")
        counts: dict[str, tuple[int, int]] = {}
        for record in numstat.split("\0"):
            if not record.strip():
                continue
            plus, minus, path = record.split("\t", 2)
            counts[path] = (int(plus) if plus != "-" else 0, int(minus) if minus != "-" else 0)
        parts = [p for p in status.split("\0") if p]
        out = []
        for code, path in zip(parts[0::2], parts[1::2], strict=True):
            added, deleted = counts.get(path, (0, 0))
            kind = {"A": "added", "D": "removed", "M": "modified"}.get(code[0], "changed")
            out.append(FileChange(path, kind, added, deleted))
        return out
