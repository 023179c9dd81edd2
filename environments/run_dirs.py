"""Per-run state directories under one root, and the run tombstones that fence a cleaned-up run out of them.

The layout the local provider, the workspace manager and the Docker provider share: ``ROOT/<path_key(run_id)>/``
holds the run's ``tombstone.json`` (``{"run_id": ..., "at": <unix time>}``) once it is cleaned up, next to a
``run.lock`` flock and, where the owner records its operations, one ``<key>.json`` record per operation
(:meth:`RunDirs.records`). Creators hold ``run.lock`` shared for the whole check-then-create span; cleanup writes
the tombstone first and then takes ``run.lock`` exclusively, so it waits for every creation already past the
check, and every creation that starts later sees the tombstone. The kernel drops a lock whose holder dies, so a
killed worker never blocks cleanup.

The fence is as wide as ``ROOT``: workers that share one engine must share this directory. (The fence that holds
across worker hosts is the tombstone in the shared evidence store, :mod:`environments.run_fence`.)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from environments.files import locked, path_key, read_json, write_json_atomic
from environments.interface import RunFencedError

TOMBSTONE = "tombstone.json"


class RunDirs:
    def __init__(self, root: Path) -> None:
        self.root = root.absolute()

    def run_dir(self, run_id: str) -> Path:
        return self.root / path_key(run_id)

    def run_dirs(self, run_id: str | None = None) -> list[Path]:
        """The directory of ``run_id``; with ``None``, every run's directory under the root, sorted."""
        if run_id is not None:
            return [self.run_dir(run_id)]
        return sorted(p for p in self.root.iterdir() if p.is_dir()) if self.root.is_dir() else []

    def is_tombstoned(self, run_id: str) -> bool:
        return (self.run_dir(run_id) / TOMBSTONE).exists()

    @contextlib.contextmanager
    def creating(self, run_id: str, op_id: str, *, doing: str = "provision") -> Iterator[Path]:
        """Hold the run open for creation; raise ``RunFencedError`` (``refusing to <doing> <op_id>``) if it is
        tombstoned. Yields the run dir."""
        run_dir = self.run_dir(run_id)
        with locked(run_dir / "run.lock", shared=True):
            if self.is_tombstoned(run_id):
                raise RunFencedError(f"run {run_id} was cleaned up; refusing to {doing} {op_id}")
            yield run_dir

    @contextlib.contextmanager
    def cleaning(self, run_id: str) -> Iterator[Path]:
        """Tombstone ``run_id`` (again, if it is already), then hold it exclusively while its resources are
        removed. Yields the run dir. A tombstone that cannot be written raises, and nothing is removed."""
        run_dir = self.run_dir(run_id)
        write_json_atomic(run_dir / TOMBSTONE, {"run_id": run_id, "at": time.time()})
        with locked(run_dir / "run.lock"):
            yield run_dir

    def records(self, run_id: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        """The operations' records of ``run_id`` (of every run when ``None``) as ``(key, record)``: every
        ``<key>.json`` in the run's directory but the tombstone, in order of run directory and key; one removed
        meanwhile is left out."""
        found = []
        for run_dir in self.run_dirs(run_id):
            for record_path in sorted(run_dir.glob("*.json")):
                if record_path.name != TOMBSTONE and (record := read_json(record_path)) is not None:
                    found.append((record_path.stem, record))
        return found
