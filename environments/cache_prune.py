"""Pruning a worker's caches: the logic behind ``durafix cache prune``.

A worker keeps four caches that no run owns and that nothing else ever shrinks: git mirrors of the
repositories it has seen (:class:`~environments.mirror.MirrorCache`), the results of setup per lock hash
(:class:`~environments.depcache.DependencyCache`), Docker images (base and app images,
:class:`~environments.docker.images.ImageBuilder`) and the root filesystem tarballs base images are imported from.
Each kind is a :class:`CacheSource`; this module plans and carries out their pruning the same way for all.

Contracts:

- **Age is last use.** An entry is *eligible* when it has not been used since ``cutoff``: each cache stamps
  an entry every time it serves it (the stamp's mtime), and an entry without a stamp counts from when it was
  made. Eligible is necessary, never sufficient.
- **Never removed**, whatever its age: an entry its source reports in use (a mirror a workspace borrows
  objects from, an image any container uses, running or stopped, a base image other images are built on)
  or busy (its lock is held: a mirror being served, fetched or built on, a dependency entry being restored or
  built, an image or tarball being built).
  Locks are only ever tried, never waited for, so pruning never blocks a worker and a busy entry is skipped.
- **The plan is fixed before anything is removed** (:func:`survey`) and never widened: acting
  (:func:`prune`) takes only the planned entries, and re-checks each one under its source's locks just before
  removing it. An entry that was used, became busy or in use since the listing is skipped, which only
  narrows the plan. One failure does not stop the others; each is reported with its error.
- Removing is idempotent: an entry already gone is skipped, and running the prune again is always safe.
- **One mirror by its URL** (:func:`plan_mirror`, ``durafix cache prune --mirror URL``): that mirror whatever
  its age, under every other rule above: a mirror being cloned or fetched, served or built on, or borrowed by
  a workspace is kept with the reason (never waited for), and a URL no mirror was made from is refused
  (:class:`UnknownMirrorError`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Collection, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from environments.depcache import REMOVING_MARK, TMP_MARK, DependencyCache

# try_locked is re-exported: the cache sources elsewhere (Docker's image cache) take their locks through here.
from environments.files import remove_tree
from environments.files import try_locked as try_locked
from environments.inventory import HOLDER_ERRORS, Unavailable
from environments.mirror import MirrorCache
from environments.workspace import WorkspaceManager

MIRROR, DEPENDENCIES, IMAGE, TARBALL = "mirror", "dependencies", "image", "rootfs-tarball"
FETCHING = "busy: being cloned or fetched"
_UNITS = (("d", 86400), ("h", 3600), ("m", 60))


@dataclass
class CacheEntry:
    """One cached thing: ``ref`` is what its source removes (a path, an image ID), ``name`` what people read."""

    kind: str
    name: str
    ref: str
    size_bytes: int
    last_used: float
    stamped: bool
    # Why the entry stays whatever its age (in use or busy), or, once planned or acted on, why it goes, was
    # skipped, or could not be removed.
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "ref": self.ref,
            "size_bytes": self.size_bytes,
            "last_used": iso_time(self.last_used),
            "last_used_from": "stamp" if self.stamped else "created",
            "reason": self.reason,
        }


class CacheSource(Protocol):
    """One cache. Every method but :meth:`entries` is about one entry :meth:`entries` listed."""

    name: str

    def entries(self) -> list[CacheEntry]:
        """What the cache holds, in the order it may be removed (an image before the base it is built on)."""
        ...

    def hold(self, entry: CacheEntry, *, create: bool) -> AbstractContextManager[str]:
        """Take the entry's locks without waiting; yields ``""`` when held, else why the entry is busy.

        ``create=False`` (surveying) never creates a lock file: a missing one is free.
        """
        ...

    def present(self, entry: CacheEntry) -> bool: ...

    def last_used(self, entry: CacheEntry) -> float:
        """When the entry was last used, read again now (a stamp touched since the listing counts)."""
        ...

    def in_use(self, entry: CacheEntry, going: Collection[str]) -> str:
        """Why the entry must stay (``""`` when nothing needs it).

        ``going``: refs the survey already planned to remove (an image built on a base does not keep the base
        when it goes first). Empty when acting: by then each of them is gone, or still there and counts.
        """
        ...

    def delete(self, entry: CacheEntry) -> None:
        """Remove the entry and its stamp; called with :meth:`hold` held and every check passed."""
        ...


@dataclass
class Plan:
    """What a prune will take (``eligible``, with the source that removes each) and what it keeps, and why."""

    cutoff: float
    eligible: list[tuple[CacheSource, CacheEntry]] = field(default_factory=list)
    kept: list[CacheEntry] = field(default_factory=list)
    unavailable: list[Unavailable] = field(default_factory=list)


@dataclass
class Outcome:
    """What acting on a plan did. ``remaining`` entries carry their error as ``reason``."""

    removed: list[CacheEntry] = field(default_factory=list)
    skipped: list[CacheEntry] = field(default_factory=list)
    remaining: list[CacheEntry] = field(default_factory=list)


def iso_time(epoch: float) -> str:
    """``2024-05-01T10:00:00+00:00``: a time in the JSON documents."""
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


def age_text(seconds: float) -> str:
    """``45s``, ``12m``, ``5h``, ``20d``: the largest whole unit (an age, so rounded down)."""
    for unit, size in _UNITS:
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(int(seconds), 0)}s"


def duration_text(value: timedelta) -> str:
    """``14d``, ``36h``, ``90m``, ``45s``: exact, in the largest unit that divides it."""
    seconds = value.total_seconds()
    for unit, size in _UNITS:
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def survey(sources: Iterable[CacheSource], older_than: timedelta, now: float) -> Plan:
    """List every source once and sort each entry into eligible (unused for longer than ``older_than``, free)
    or kept.

    Read-only. A source that cannot be listed is reported in :attr:`Plan.unavailable`, and nothing of it is
    planned: a partial listing could have missed what makes an entry needed.
    """
    plan = Plan(cutoff=now - older_than.total_seconds())
    for source in sources:
        try:
            eligible, kept = _survey_one(source, plan.cutoff, duration_text(older_than))
        except HOLDER_ERRORS as exc:
            plan.unavailable.append(Unavailable(source.name, f"listing failed: {exc}"))
            continue
        plan.eligible.extend((source, entry) for entry in eligible)
        plan.kept.extend(kept)
    return plan


def _survey_one(source: CacheSource, cutoff: float, threshold: str) -> tuple[list[CacheEntry], list[CacheEntry]]:
    eligible: list[CacheEntry] = []
    kept: list[CacheEntry] = []
    for entry in source.entries():
        with source.hold(entry, create=False) as busy:
            entry.reason = busy or source.in_use(entry, [e.ref for e in eligible])
        if entry.reason:
            kept.append(entry)
        elif entry.last_used >= cutoff:
            entry.reason = f"used within {threshold}"
            kept.append(entry)
        else:
            entry.reason = f"unused for more than {threshold}"
            eligible.append(entry)
    return eligible, kept


def prune(plan: Plan) -> Outcome:
    """Remove the planned entries, each re-checked under its locks first; never anything beyond the plan."""
    outcome = Outcome()
    for source, entry in plan.eligible:
        try:
            skipped = _remove(source, entry, plan.cutoff)
        except HOLDER_ERRORS as exc:
            entry.reason = str(exc)
            outcome.remaining.append(entry)
            continue
        if skipped:
            entry.reason = skipped
            outcome.skipped.append(entry)
        else:
            outcome.removed.append(entry)
    return outcome


def _remove(source: CacheSource, entry: CacheEntry, cutoff: float) -> str:
    """Remove ``entry`` if it is still free, unused since ``cutoff`` and needed by nothing; else say why not."""
    with source.hold(entry, create=True) as busy:
        if busy:
            return busy
        if not source.present(entry):
            return "already gone"
        if source.last_used(entry) >= cutoff:
            return "used since the listing"
        # Everything planned before this entry has been dealt with: what is left of it is still there.
        in_use = source.in_use(entry, going=())
        if in_use:
            return in_use
        source.delete(entry)
        return ""


class UnknownMirrorError(LookupError):
    """No mirror of ``clone_url`` is cached; ``known`` are the clone URLs of the mirrors that are."""

    def __init__(self, clone_url: str, known: list[str]) -> None:
        listed = ", ".join(known) if known else "none"
        super().__init__(f"no mirror of {clone_url} is cached (mirrors cached: {listed})")
        self.clone_url = clone_url
        self.known = known


def plan_mirror(source: MirrorSource, clone_url: str, now: float) -> Plan:
    """The plan for dropping the one mirror made from ``clone_url``, however recently it was used.

    Read-only, like :func:`survey`: the mirror is eligible only when nobody holds its locks (no clone, fetch
    or bundle import in progress; nobody served from it or building a workspace on it) and no workspace
    borrows its objects; otherwise it is kept with the reason. ``now`` is the plan's cutoff, so
    :func:`prune` still skips the mirror if a worker is served it after this listing. Raises
    :class:`UnknownMirrorError` when no mirror of ``clone_url`` is cached.
    """
    entry = source.entry_for(clone_url)
    if entry is None:
        raise UnknownMirrorError(clone_url, [e.name for e in source.entries()])
    plan = Plan(cutoff=now)
    with source.hold(entry, create=False) as busy:
        entry.reason = busy or source.in_use(entry, ())
    if entry.reason:
        plan.kept.append(entry)
    else:
        entry.reason = "named by its URL"
        plan.eligible.append((source, entry))
    return plan


def first_and_count(names: Iterable[str]) -> str:
    """``a`` or ``a and 3 more``: one name to look at, and how many others there are."""
    listed = list(names)
    return listed[0] + (f" and {len(listed) - 1} more" if len(listed) > 1 else "")


def tree_size(path: Path) -> int:
    """Bytes in the files under ``path`` (not following links); what removing the tree frees."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += (Path(root) / name).lstat().st_size
    return total


class MirrorSource:
    """The mirror cache of a :class:`WorkspaceManager`, which is also what tells which mirrors are borrowed."""

    name = "mirrors"

    def __init__(self, workspaces: WorkspaceManager) -> None:
        self.workspaces = workspaces
        self.mirrors: MirrorCache = workspaces.mirrors

    def entries(self) -> list[CacheEntry]:
        found = []
        for mirror in self.mirrors.cached():
            # Removed since the directory was listed (by another prune): nothing to plan for it.
            with contextlib.suppress(FileNotFoundError):
                found.append(self._entry(mirror))
        return found

    def entry_for(self, clone_url: str) -> CacheEntry | None:
        """The mirror made from ``clone_url``, or ``None`` when there is none.

        Found where :meth:`MirrorCache.path_for` puts it, or else among the mirrors whose origin is
        ``clone_url`` (a mirror whose directory is named otherwise is still the one the URL names).
        """
        direct = self.mirrors.path_for(clone_url)
        # Lazy: the scan asks git for each mirror's origin, and only runs when the direct place is empty.
        by_origin = (m for m in self.mirrors.cached() if m != direct and self.mirrors.clone_url_of(m) == clone_url)
        for mirror in itertools.chain([direct], by_origin):
            # Gone since it was looked at (another prune): not there, like one never made.
            with contextlib.suppress(FileNotFoundError):
                if mirror.is_dir():
                    return self._entry(mirror)
        return None

    def _entry(self, mirror: Path) -> CacheEntry:
        last_used, stamped = self.mirrors.last_used(mirror)
        return CacheEntry(
            kind=MIRROR,
            name=self.mirrors.clone_url_of(mirror),
            ref=str(mirror),
            size_bytes=tree_size(mirror),
            last_used=last_used,
            stamped=stamped,
        )

    @contextlib.contextmanager
    def hold(self, entry: CacheEntry, *, create: bool) -> Iterator[str]:
        mirror = Path(entry.ref)
        # The use lock first: ensure and workspace builds hold it shared for as long as they rely on the mirror.
        with try_locked(self.mirrors.use_lock(mirror), create=create) as unused:
            if not unused:
                # A fetch runs inside a use: the update lock tells the two apart, for the message only.
                with try_locked(self.mirrors.build_lock(mirror), create=False) as idle:
                    yield "in use: being served, or a workspace is being built from it" if idle else FETCHING
                return
            with try_locked(self.mirrors.build_lock(mirror), create=create) as idle:
                yield "" if idle else FETCHING

    def present(self, entry: CacheEntry) -> bool:
        return Path(entry.ref).is_dir()

    def last_used(self, entry: CacheEntry) -> float:
        return self.mirrors.last_used(Path(entry.ref))[0]

    def in_use(self, entry: CacheEntry, going: Collection[str]) -> str:
        borrowers = self.workspaces.borrowers(Path(entry.ref))
        return "in use: borrowed by workspace " + first_and_count(map(str, borrowers)) if borrowers else ""

    def delete(self, entry: CacheEntry) -> None:
        # The stamp is inside the mirror and goes with it. The lock files stay: a process may have one open
        # and be about to lock it, and a second file under the same name would let two holders in at once.
        remove_tree(Path(entry.ref))


class DependencySource:
    """The entries of a :class:`DependencyCache`, and what crashed builders and removals left beside them.

    An entry is busy while it is being restored into a workspace (its use lock) or rebuilt (its build lock), an
    unfinished build while its builder lives (the lock beside it). Nothing else needs an entry: a workspace
    restored from it holds its own links or copies, which removing the entry leaves alone (so the size shown
    for an entry linked into live workspaces is more than removing it frees).
    """

    name = "dependencies"

    def __init__(self, cache: DependencyCache) -> None:
        self.cache = cache

    def entries(self) -> list[CacheEntry]:
        found = []
        for path in self.cache.entries():
            with contextlib.suppress(FileNotFoundError):
                last_used, stamped = self.cache.last_used(path)
                found.append(
                    CacheEntry(
                        kind=DEPENDENCIES,
                        name=self._name(path),
                        ref=str(path),
                        size_bytes=tree_size(path),
                        last_used=last_used,
                        stamped=stamped,
                    )
                )
        return found

    def _name(self, path: Path) -> str:
        if TMP_MARK in path.name:
            return f"{path.parent.name}: unfinished build of {_entry_name(path)}"
        if REMOVING_MARK in path.name:
            return f"{path.parent.name}: interrupted removal of {_entry_name(path)}"
        record = self.cache.read_record(path)
        if record is None:
            return f"{path.parent.name}/{path.name} (no complete build record)"
        return f"{record.repository} {', '.join(record.paths)} ({', '.join(record.lock_files)}) {path.name[:12]}"

    @contextlib.contextmanager
    def hold(self, entry: CacheEntry, *, create: bool) -> Iterator[str]:
        path = Path(entry.ref)
        if TMP_MARK in path.name:
            with try_locked(path.with_name(path.name + ".lock"), create=False) as free:
                yield "" if free else "busy: being built"
            return
        target = path.with_name(_entry_name(path))
        with try_locked(self.cache.use_lock(target), create=create) as unused:
            if not unused:
                yield "in use: being restored into a workspace"
                return
            with try_locked(self.cache.build_lock(target), create=create) as idle:
                yield "" if idle else "busy: being built"

    def present(self, entry: CacheEntry) -> bool:
        return Path(entry.ref).is_dir()

    def last_used(self, entry: CacheEntry) -> float:
        return self.cache.last_used(Path(entry.ref))[0]

    def in_use(self, entry: CacheEntry, going: Collection[str]) -> str:
        return ""

    def delete(self, entry: CacheEntry) -> None:
        path = Path(entry.ref)
        remove_tree(path)
        if TMP_MARK in path.name:
            # Named for this one build only: no other holder will ever open it.
            path.with_name(path.name + ".lock").unlink(missing_ok=True)


def _entry_name(path: Path) -> str:
    """The entry a leftover (``.<entry>.tmp-<id>``, ``.<entry>.removing-<id>``) belonged to; an entry's own name."""
    for mark in (TMP_MARK, REMOVING_MARK):
        if mark in path.name:
            return path.name[1:].split(mark, 1)[0]
    return path.name
