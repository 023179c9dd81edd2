"""The Docker image cache and the root filesystem tarballs as sources for ``durafix cache prune``.

Both follow :class:`~environments.docker.images.ImageBuilder`'s own names and locks in its cache directory, so a
prune and a build exclude each other (see :mod:`environments.cache_prune` for the contracts all sources keep).

- :class:`ImageSource`: the images in the engine that carry :data:`~environments.docker.images.IMAGE_LABEL` (base
  images, CA layers and app images, and untagged leftovers of failed builds, which inherit the base's labels).
  Last use is the newest stamp of the image's tags, else the image's creation time. Never removed: an image any
  container uses, running or stopped (the engine would refuse too); a base image while another image built on it
  stays (same ``durafix.recipe`` label); an image whose build lock is held. Removal is by image ID and never
  forced, so an image someone else also tagged is refused by the engine and reported, not untagged.
- :class:`TarballSource`: ``rootfs-<h>.tar`` files. Last use is the tarball's stamp (touched whenever its base
  image is served), else its mtime. Never removed while its base image's build lock is held (the tarball is
  made and imported under that lock). Works without an engine: tarballs are plain files.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from docker.errors import ImageNotFound

from environments.cache_prune import IMAGE, TARBALL, CacheEntry, first_and_count, try_locked
from environments.docker.images import (
    BASE_REPOSITORY,
    IMAGE_LABEL,
    ImageBuilder,
    build_lock_path,
    cache_key,
    rootfs_lock_path,
    rootfs_stamp_path,
    rootfs_tarballs,
    stamp_path,
)

RECIPE_LABEL = "durafix.recipe"
_UNTAGGED = "<none>:<none>"


@dataclass(frozen=True)
class _Image:
    tags: tuple[str, ...]
    created: float
    # The recipe hash when this is a base image (tagged durafix/base:<h>): images built on it share the label.
    base_of: str | None


class ImageSource:
    """The labelled images in ``builder``'s engine, judged by the stamps in ``builder``'s cache directory."""

    name = "docker"

    def __init__(self, builder: ImageBuilder) -> None:
        self.client: docker.DockerClient = builder.client
        self.cache_dir = builder.cache_dir
        self._images: dict[str, _Image] = {}

    def entries(self) -> list[CacheEntry]:
        found: list[CacheEntry] = []
        for listed in self.client.api.images(filters={"label": IMAGE_LABEL}):
            tags = tuple(t for t in listed.get("RepoTags") or () if t != _UNTAGGED)
            base = next((t.partition(":")[2] for t in tags if t.partition(":")[0] == BASE_REPOSITORY), None)
            image = _Image(tags=tags, created=float(listed["Created"]), base_of=base)
            self._images[listed["Id"]] = image
            last_used, stamped = self._last_used(image)
            found.append(
                CacheEntry(
                    kind=IMAGE,
                    name=", ".join(tags) or f"(untagged) {listed['Id'][:19]}",
                    ref=listed["Id"],
                    size_bytes=int(listed.get("Size") or 0),
                    last_used=last_used,
                    stamped=stamped,
                )
            )
        # Base images last: by then every image built on them that was going to go has gone.
        return sorted(found, key=lambda e: self._images[e.ref].base_of is not None)

    @contextlib.contextmanager
    def hold(self, entry: CacheEntry, *, create: bool) -> Iterator[str]:
        with contextlib.ExitStack() as stack:
            for tag in self._own_tags(entry):
                if not stack.enter_context(try_locked(build_lock_path(self.cache_dir, tag), create=create)):
                    yield f"busy: {tag} is being built"
                    return
            yield ""

    def present(self, entry: CacheEntry) -> bool:
        try:
            self.client.api.inspect_image(entry.ref)
        except ImageNotFound:
            return False
        return True

    def last_used(self, entry: CacheEntry) -> float:
        return self._last_used(self._images[entry.ref])[0]

    def in_use(self, entry: CacheEntry, going: Collection[str]) -> str:
        users = [c for c in self.client.api.containers(all=True) if c.get("ImageID") == entry.ref]
        if users:
            return "in use: " + first_and_count(
                f"container {_container_name(c)} ({c.get('State', '?')})" for c in users
            )
        base_of = self._images[entry.ref].base_of
        if base_of is not None:
            built_on = [
                i
                for i in self.client.api.images(filters={"label": f"{RECIPE_LABEL}={base_of}"})
                if i["Id"] != entry.ref and i["Id"] not in going
            ]
            if built_on:
                return "in use: base of " + first_and_count(_image_name(i) for i in built_on)
        return ""

    def delete(self, entry: CacheEntry) -> None:
        # Never forced: the engine itself then refuses an image a container uses or someone else tagged.
        self.client.api.remove_image(entry.ref, force=False, noprune=False)
        for tag in self._own_tags(entry):
            stamp_path(self.cache_dir, tag).unlink(missing_ok=True)

    def _own_tags(self, entry: CacheEntry) -> list[str]:
        """The entry's tags that :class:`ImageBuilder` builds (and so has a lock and a stamp for)."""
        return [t for t in self._images[entry.ref].tags if cache_key(t) is not None]

    def _last_used(self, image: _Image) -> tuple[float, bool]:
        """The newest stamp of the image's tags, else its creation time; and whether a stamp said it."""
        times = []
        for tag in image.tags:
            if cache_key(tag) is not None:
                with contextlib.suppress(FileNotFoundError):
                    times.append(stamp_path(self.cache_dir, tag).stat().st_mtime)
        return (max(times), True) if times else (image.created, False)


class TarballSource:
    """The root filesystem tarballs in an image cache directory."""

    name = "rootfs-tarballs"

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir

    def entries(self) -> list[CacheEntry]:
        found = []
        for tarball in rootfs_tarballs(self.cache_dir):
            # Removed since the directory was listed (by another prune): nothing to plan for it.
            with contextlib.suppress(FileNotFoundError):
                last_used, stamped = _tarball_last_used(tarball)
                found.append(
                    CacheEntry(
                        kind=TARBALL,
                        name=tarball.name,
                        ref=str(tarball),
                        size_bytes=tarball.stat().st_size,
                        last_used=last_used,
                        stamped=stamped,
                    )
                )
        return found

    @contextlib.contextmanager
    def hold(self, entry: CacheEntry, *, create: bool) -> Iterator[str]:
        with try_locked(rootfs_lock_path(Path(entry.ref)), create=create) as free:
            yield "" if free else "busy: its base image is being built"

    def present(self, entry: CacheEntry) -> bool:
        return Path(entry.ref).is_file()

    def last_used(self, entry: CacheEntry) -> float:
        return _tarball_last_used(Path(entry.ref))[0]

    def in_use(self, entry: CacheEntry, going: Collection[str]) -> str:
        # Only a base build reads a tarball, and it does so under the lock :meth:`hold` takes.
        return ""

    def delete(self, entry: CacheEntry) -> None:
        tarball = Path(entry.ref)
        tarball.unlink()
        rootfs_stamp_path(tarball).unlink(missing_ok=True)


def _tarball_last_used(tarball: Path) -> tuple[float, bool]:
    try:
        return rootfs_stamp_path(tarball).stat().st_mtime, True
    except FileNotFoundError:
        return tarball.stat().st_mtime, False


def _container_name(container: dict[str, Any]) -> str:
    names = container.get("Names") or [container["Id"][:12]]
    return str(names[0]).lstrip("/")


def _image_name(image: dict[str, Any]) -> str:
    tags = [t for t in image.get("RepoTags") or () if t != _UNTAGGED]
    return tags[0] if tags else f"(untagged) {image['Id'][:19]}"
