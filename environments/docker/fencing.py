"""Run tombstones that fence late provisioning attempts out of a cleaned-up run.

The on-disk format is the one the workspace manager uses: ``ROOT/<path_key(run_id)>/tombstone.json``
(``{"run_id": ..., "at": <unix time>}``) next to a ``run.lock`` flock. Creators hold ``run.lock`` shared for
the whole check-then-create span; cleanup writes the tombstone first and then takes ``run.lock``
exclusively, so it waits for every creation already past the check, and every creation that starts later
sees the tombstone. The kernel drops a lock whose holder dies, so a killed worker never blocks cleanup.

The fence is as wide as ``ROOT``: workers that share one engine must share this directory.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from environments.files import locked, path_key, read_json, write_json_atomic
from environments.interface import RunFencedError


class RunFence:
    def __init__(self, root: Path) -> None:
        self.root = root.absolute()

    def run_dir(self, run_id: str) -> Path:
        return self.root / path_key(run_id)

    def is_tombstoned(self, run_id: str) -> bool:
        return read_json(self.run_dir(run_id) / "tombstone.json") is not None

    @contextlib.contextmanager
    def creating(self, run_id: str, op_id: str) -> Iterator[Path]:
        """Hold the run open for creation; raise ``RunFencedError`` if it is tombstoned. Yields the run dir."""
        run_dir = self.run_dir(run_id)
        with locked(run_dir / "run.lock", shared=True):
            if self.is_tombstoned(run_id):
                raise RunFencedError(f"run {run_id} was cleaned up; refusing to provision {op_id}")
            yield run_dir

    @contextlib.contextmanager
    def cleaning(self, run_id: str) -> Iterator[None]:
        """Tombstone ``run_id`` (idempotent), then hold it exclusively while its resources are removed."""
        run_dir = self.run_dir(run_id)
        if not self.is_tombstoned(run_id):
            write_json_atomic(run_dir / "tombstone.json", {"run_id": run_id, "at": time.time()})
        with locked(run_dir / "run.lock"):
            yield
