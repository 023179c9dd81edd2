"""The files by which an on-disk cache's users and its pruner (:mod:`environments.cache_prune`) agree on an entry.

For an entry at ``<entry>`` (a repository mirror, a dependency-cache entry):

- ``<entry>.lock``: held exclusively while the entry is built or updated (for a mirror: clone, fetch, bundle
  import);
- ``<entry>.use.lock``: held shared while the entry is used; exclusively only by pruning (and by a builder
  replacing a damaged entry);
- ``<entry>/<stamp_name>``: touched at each use; its mtime is the entry's last use, which pruning judges by.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar


class CacheEntries:
    """Where an entry's locks and stamp are; a cache subclasses it and names its stamp file."""

    stamp_name: ClassVar[str]

    def build_lock(self, entry: Path) -> Path:
        return entry.with_name(entry.name + ".lock")

    def use_lock(self, entry: Path) -> Path:
        return entry.with_name(entry.name + ".use.lock")

    def stamp_path(self, entry: Path) -> Path:
        return entry / self.stamp_name

    def last_used(self, entry: Path) -> tuple[float, bool]:
        """When ``entry`` was last used (seconds since the epoch), and whether that comes from its stamp.

        Without a stamp (an entry made before stamps existed, or one whose stamp was lost) the entry's own mtime
        stands in: it is at least the entry's creation time, so the fallback never makes an entry look older
        than it is.
        """
        try:
            return self.stamp_path(entry).stat().st_mtime, True
        except FileNotFoundError:
            return entry.stat().st_mtime, False
