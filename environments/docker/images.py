"""Environment images built from Debian packages and a workspace, without any registry.

Three layers, all content-addressed and reused when present:

- The *base image* ``durafix/base:<h>``, where ``h`` is :func:`recipe_hash` of the :class:`ImageRecipe`
  (distribution + sorted package set; :func:`base_recipe` adds :data:`EGRESS_PACKAGES`, ``socat`` and
  ``ca-certificates``, for a recipe whose setup has the network, so only such recipes get another base).
  Built by ``debootstrap --variant=minbase`` from the Debian mirror apt is configured with, then the packages
  installed by the tree's own ``apt-get install --no-install-recommends`` in a chroot (debootstrap's
  ``--include`` resolver misses dependencies: npm's), tarred, and imported with ``docker import``. The root filesystem
  tarball is cached as ``STATE/cache/rootfs-<h>.tar``, so an engine with an empty data root re-imports it
  instead of bootstrapping again.
- The *CA layer* ``durafix/trust:<t>`` (:mod:`environments.docker.trust`, :meth:`ImageBuilder.ensure_trust`):
  for a base with ``ca-certificates``, the worker's CA bundle added the Debian way with the bundle variables
  pointing at the image's paths; ``t`` digests the base image ID and the bundle's SHA-256. App images are built on
  it instead of the base.
- The *app image* ``durafix/app:<d>``: ``FROM`` the base image (or its CA layer), the workspace copied to ``/app``
  owned by the app's user (``65534:65534``), the recipe's ``setup`` commands as ``RUN`` steps that run as that user
  with every capability dropped (``setpriv --reuid --regid --clear-groups --inh-caps=-all --bounding-set=-all
  --no-new-privs``: a setuid binary in the image gains nothing), built with ``network_mode="none"``: no build step
  ever has a network. A recipe with ``setup_network: true`` (installs need the package index) gets its setup
  commands in *setup containers* instead (:mod:`environments.docker.setup_containers`): the workspace image (the
  same ``FROM`` and ``COPY``, no setup step, no network), then each command in a container of its own with
  ``network_mode="none"`` whose one way out is the egress proxy's unix socket (:mod:`environments.egress`, the same
  proxy and bridge as the local provider's setup), as the app's user with every capability dropped and the recipe's
  limits, committed when it exits 0; the last commit is tagged with the app image's tag. ``d`` digests exactly what
  goes into the image: the base image ID, the setup commands, the network choice and the workspace's files
  (:func:`tree_digest`), so an unchanged workspace never rebuilds and a changed byte always does.

Builds of one tag (setup containers included) are serialised across processes with a lock file under
``STATE/cache``; whoever gets the lock second finds the image (or tarball) present and reuses it. Cache files are
written to a temporary name and renamed, so a crash never leaves a partial tarball under the final name. Images
are a shared cache, not owned by any run: ``cleanup_run`` leaves them in place.

Last use is recorded for ``durafix cache prune``: every time :meth:`ImageBuilder.ensure_base` or
:meth:`ImageBuilder.ensure_app` returns a tag, the tag's stamp (``base-<h>.used`` / ``app-<d>.used`` next to
its lock) is touched under the tag's build lock, and so is the root filesystem tarball's
(``rootfs-<h>.used``) whenever its base image is served: the tarball is what rebuilds that base on an empty
engine, so it is in use as long as the base is. Pruning takes the same build locks (without waiting), so it
never removes an image or tarball that is being built or has just been served.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import tarfile
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

import docker
from docker.errors import APIError, ImageNotFound

from environments.ca_bundle import SYSTEM_BUNDLE, CABundle
from environments.commands import log_note
from environments.commands import tail as log_tail
from environments.diagnosis import FailedCommand, Stage
from environments.docker.setup_containers import SetupCommandFailed, container_passthrough, run_setup_containers
from environments.docker.trust import CA_PACKAGE, TRUST_REPOSITORY, trust_dockerfile, trust_tag
from environments.egress import ALLOWED_PORTS, DEFAULT_REGISTRY_HOSTS, EgressEvent, parse_hosts
from environments.files import locked
from environments.interface import AppRecipe, EnvironmentError, ImageRecipe, Progress
from environments.progress import command_text, ignore
from environments.spec import cached_paths, dependency_lock_hash, lock_files

BASE_REPOSITORY = "durafix/base"
APP_REPOSITORY = "durafix/app"
APP_DIR = "/app"
# Images are a cache, not a run's resource: they carry their own label, never the ownership labels.
IMAGE_LABEL = "durafix.image"
_FORMAT = 1
# The app image's own format (2: workspace owned by the app user, setup steps unprivileged); the base image
# keeps _FORMAT so its cached root filesystem tarballs stay valid.
_APP_FORMAT = 2
APP_UID = 65534
# How each setup step runs: as the app's user, no capabilities (bounding set included), no new privileges.
_UNPRIVILEGED = [
    "setpriv",
    f"--reuid={APP_UID}",
    f"--regid={APP_UID}",
    "--clear-groups",
    "--inh-caps=-all",
    "--bounding-set=-all",
    "--no-new-privs",
    "/usr/bin/env",
    "HOME=/tmp",
]
# What a setup with the network needs in its image: the bridge to the egress proxy, and the CA certificates
# every registry's HTTPS is checked against.
EGRESS_PACKAGES = ("socat", "ca-certificates")
# How long one setup command run in a setup container may take by default.
SETUP_TIMEOUT_S = 1800.0
_SUITES = {"debian-bookworm": "bookworm"}
_OPTIONS = re.compile(r"\[[^\]]*\]")
_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Never part of an app image: version-control metadata is large and changes without the tree changing.
_EXCLUDED_DIRS = {".git"}
_SPOOL_BYTES = 64 * 1024 * 1024
# The names of a tag's lock and stamp files in the cache directory: ``base-<h>.lock``, ``app-<d>.used``.
_CACHE_PREFIXES = {BASE_REPOSITORY: "base", TRUST_REPOSITORY: "trust", APP_REPOSITORY: "app"}
_ROOTFS_NAME = re.compile(r"^rootfs-([0-9a-f]{12})\.tar$")
# How the engine's (classic) builder announces each Dockerfile instruction in its output stream.
_BUILD_STEP = re.compile(r"^Step (\d+)/\d+ : ")


class ImageBuildError(EnvironmentError):
    """An image could not be built; the message carries the failing tool's output tail."""


class SetupStepError(ImageBuildError):
    """One of the recipe's setup commands failed as an image build step or in a setup container (the recipe's
    failure, not the engine's). The first line names the command and its exit; the output's tail follows.
    ``failed`` names the command (:func:`environments.diagnosis.diagnose` judges it with the message)."""


# How the engine's classic builder says a RUN step failed.
_STEP_EXIT = re.compile(r"returned a non-zero code: (\d+)")


def cache_key(tag: str) -> str | None:
    """The name ``tag``'s lock and stamp files carry in the cache directory; ``None`` for a tag not built here."""
    repository, _, version = tag.partition(":")
    prefix = _CACHE_PREFIXES.get(repository)
    return f"{prefix}-{version}" if prefix is not None and version else None


def _cache_file(cache_dir: Path, tag: str, suffix: str) -> Path:
    key = cache_key(tag)
    if key is None:
        raise ValueError(f"{tag} is not an image durafix builds")
    return cache_dir / f"{key}{suffix}"


def build_lock_path(cache_dir: Path, tag: str) -> Path:
    """The lock serialising builds of ``tag`` (and, for a base image, of its root filesystem tarball)."""
    return _cache_file(cache_dir, tag, ".lock")


def stamp_path(cache_dir: Path, tag: str) -> Path:
    """The file whose mtime is when ``tag`` was last returned by ``ensure_base`` / ``ensure_app``."""
    return _cache_file(cache_dir, tag, ".used")


def rootfs_tarballs(cache_dir: Path) -> list[Path]:
    """The root filesystem tarballs in ``cache_dir`` (``rootfs-<h>.tar``), sorted; partial ones are dot-names."""
    if not cache_dir.is_dir():
        return []
    return sorted(p for p in cache_dir.iterdir() if _ROOTFS_NAME.match(p.name) and p.is_file())


def rootfs_stamp_path(tarball: Path) -> Path:
    """``rootfs-<h>.used``: touched whenever the base image built from ``rootfs-<h>.tar`` is served."""
    return tarball.with_suffix(".used")


def rootfs_lock_path(tarball: Path) -> Path:
    """The base image's build lock, which also guards its tarball (it is made and read under that lock)."""
    recipe = tarball.stem.removeprefix("rootfs-")
    return build_lock_path(tarball.parent, f"{BASE_REPOSITORY}:{recipe}")


def base_recipe(recipe: AppRecipe) -> ImageRecipe:
    """The base image an app recipe's image is built on: its package list, plus :data:`EGRESS_PACKAGES` when
    setup has the network (so only such recipes get another base image)."""
    if not recipe.setup_network or not recipe.setup:
        return recipe.image
    packages = [*recipe.image.packages, *(p for p in EGRESS_PACKAGES if p not in recipe.image.packages)]
    return recipe.image.model_copy(update={"packages": packages})


def suite_for(recipe: ImageRecipe) -> str:
    return _SUITES[recipe.base]


def recipe_hash(recipe: ImageRecipe) -> str:
    """12 hex digits identifying the base image's contents: distribution and package set (order-free)."""
    packages = sorted(set(recipe.packages))
    for package in packages:
        if not _PACKAGE.match(package):
            raise ValueError(f"not a Debian package name: {package!r}")
    canonical = json.dumps({"format": _FORMAT, "base": recipe.base, "packages": packages}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def apt_mirror(suite: str, apt_dir: Path = Path("/etc/apt")) -> str:
    """The first Debian mirror apt is configured to use for ``suite`` (``main`` component).

    Reads one-line ``sources.list`` entries and deb822 ``*.sources`` stanzas; raises ``ImageBuildError``
    when none serves ``suite``.
    """
    files = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]
    for path in files:
        for line in _read_lines(path):
            fields = _OPTIONS.sub(" ", line.split("#", 1)[0]).split()
            if len(fields) >= 4 and fields[0] == "deb" and fields[2] == suite and "main" in fields[3:]:
                return fields[1]
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        for stanza in _deb822_stanzas(_read_lines(path)):
            types = stanza.get("types", "").split()
            serves = "deb" in types and suite in stanza.get("suites", "").split()
            if serves and "main" in stanza.get("components", "").split() and stanza.get("enabled", "yes") != "no":
                return stanza["uris"].split()[0]
    raise ImageBuildError(f"no apt source for Debian {suite} (main) under {apt_dir}")


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []


def _deb822_stanzas(lines: list[str]) -> Iterator[dict[str, str]]:
    stanza: dict[str, str] = {}
    key = ""
    for line in [*lines, ""]:
        if not line.strip():
            if stanza:
                yield stanza
            stanza, key = {}, ""
        elif line.startswith("#"):
            continue
        elif line[0] in " \t" and key:
            stanza[key] += " " + line.strip()
        elif ":" in line:
            key, value = line.split(":", 1)
            key = key.strip().lower()
            stanza[key] = value.strip()


def workspace_entries(workspace: Path) -> list[Path]:
    """The workspace paths an app image holds, sorted: everything but ``.git``, special files skipped."""
    entries: list[Path] = []
    for root, dirs, files in os.walk(workspace):
        dirs[:] = sorted(d for d in dirs if d not in _EXCLUDED_DIRS)
        base = Path(root)
        for name in dirs:
            entries.append(base / name)
        for name in sorted(files):
            path = base / name
            mode = path.lstat().st_mode
            if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
                entries.append(path)
    return sorted(entries, key=lambda p: p.relative_to(workspace).as_posix())


def _normal_mode(mode: int) -> int:
    """Permissions the image gets, independent of the worker's umask: readable by the unprivileged app user."""
    if stat.S_ISDIR(mode) or mode & 0o111:
        return 0o755
    return 0o644


def tree_digest(workspace: Path) -> str:
    """SHA-256 over each entry's relative path, type, normalised mode and content (or link target)."""
    digest = hashlib.sha256()
    for path in workspace_entries(workspace):
        mode = path.lstat().st_mode
        rel = path.relative_to(workspace).as_posix()
        if stat.S_ISLNK(mode):
            kind, content = "l", os.readlink(path).encode()
        elif stat.S_ISDIR(mode):
            kind, content = "d", b""
        else:
            kind, content = "f", path.read_bytes()
        header = f"{kind} {_normal_mode(mode):o} {rel} {len(content)}\n"
        digest.update(header.encode())
        digest.update(content)
    return digest.hexdigest()


def _over_dockerfile(deps_tag: str, paths: list[str]) -> tuple[str, list[str | None]]:
    """An app image on a dependency image: the old tree removed but for ``paths`` (top-level names), the new
    tree copied in; no setup step runs."""
    keep = " ".join(f"! -name {shlex.quote(p)}" for p in paths)
    clear = f"find {APP_DIR} -mindepth 1 -maxdepth 1 {keep} -exec rm -rf {{}} +"
    steps: list[tuple[str, str | None]] = [
        (f"FROM {deps_tag}", None),
        (f"RUN {json.dumps([*_UNPRIVILEGED, '/bin/sh', '-c', clear])}", None),
        (f"COPY --chown={APP_UID}:{APP_UID} src/ {APP_DIR}/", None),
        (f"WORKDIR {APP_DIR}", None),
    ]
    return "\n".join(line for line, _ in steps) + "\n", [text for _, text in steps]


def _dockerfile(base_tag: str, setup: list[str]) -> tuple[str, list[str | None]]:
    """The app image's Dockerfile, and for each of its instructions (step 1 first) the progress text to report
    when the builder reaches it (``setup: <command>`` for the setup steps, ``None`` for the others)."""
    steps: list[tuple[str, str | None]] = [
        (f"FROM {base_tag}", None),
        (f"COPY --chown={APP_UID}:{APP_UID} src/ {APP_DIR}/", None),
        (f"WORKDIR {APP_DIR}", None),
    ]
    # JSON form keeps each command one shell invocation whatever quotes or newlines it holds.
    steps += [
        (f"RUN {json.dumps([*_UNPRIVILEGED, '/bin/sh', '-c', command])}", f"setup: {command_text(command)}")
        for command in setup
    ]
    return "\n".join(line for line, _ in steps) + "\n", [text for _, text in steps]


def _step_text(chunk: dict[str, Any], step_texts: list[str | None]) -> str | None:
    """The progress text of the build step ``chunk`` announces, if it announces one that has a text."""
    match = _BUILD_STEP.match(str(chunk.get("stream", "")))
    if match is None:
        return None
    index = int(match.group(1)) - 1
    return step_texts[index] if 0 <= index < len(step_texts) else None


def _build_context(workspace: Path, dockerfile: str, out: IO[bytes]) -> None:
    """A deterministic tar: root-owned entries, mtime 0, normalised modes, ``Dockerfile`` + ``src/``."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
        src = tarfile.TarInfo("src")
        src.type, src.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(src)
        for path in workspace_entries(workspace):
            info = tar.gettarinfo(str(path), arcname=f"src/{path.relative_to(workspace).as_posix()}")
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            info.mode = _normal_mode(path.lstat().st_mode)
            if info.isreg():
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)


class ImageBuilder:
    """Builds and caches base and app images in the engine behind ``client``; cache files under ``cache_dir``.

    ``cache_dir`` (conventionally ``STATE/cache``) may be shared by engines and processes: its locks
    serialise builds and its files are only ever replaced whole.
    """

    def __init__(
        self,
        client: docker.DockerClient,
        cache_dir: Path,
        *,
        mirror: str | None = None,
        egress_hosts: tuple[str, ...] = DEFAULT_REGISTRY_HOSTS,
        egress_ports: tuple[int, ...] = ALLOWED_PORTS,
        ca_bundle: Path | None = Path(SYSTEM_BUNDLE),
        passthrough: tuple[str, ...] = (),
    ) -> None:
        self.client = client
        self.cache_dir = cache_dir.absolute()
        self.mirror = mirror
        # What a setup with the network may reach through its egress proxy (environments.egress).
        self.egress_hosts = parse_hosts(egress_hosts)
        self.egress_ports = tuple(egress_ports)
        # The worker's CA bundle, added to every image that has ca-certificates (None: Debian's bundle only).
        # Read at each build, so a changed bundle makes a new layer; a missing one is an error then, not a skip.
        self.ca_bundle = ca_bundle
        # The worker variables setup containers get (DURAFIX_SETUP_PASSTHROUGH; environments.passthrough).
        self.passthrough = passthrough
        # The egress proxy's events of the last setup this builder ran in containers (empty: none ran).
        self.last_egress: tuple[EgressEvent, ...] = ()

    def setup_key(self, tag: str) -> str:
        """What names ``tag``'s setup container and egress proxy: the tag's cache key and this builder's cache
        directory, whose build lock serialises the builds of one tag; so a container or proxy under this name
        is a dead builder's of this cache (never a live one's of another worker sharing the engine)."""
        key = cache_key(tag)
        if key is None:
            raise ValueError(f"{tag} is not an image durafix builds")
        return f"{key}-{hashlib.sha256(str(self.cache_dir).encode()).hexdigest()[:8]}"

    def base_tag(self, recipe: ImageRecipe) -> str:
        return f"{BASE_REPOSITORY}:{recipe_hash(recipe)}"

    def rootfs_tarball(self, recipe: ImageRecipe) -> Path:
        return self.cache_dir / f"rootfs-{recipe_hash(recipe)}.tar"

    def ensure_base(self, recipe: ImageRecipe, *, progress: Progress | None = None) -> str:
        """The base image's tag, importing the cached root filesystem (bootstrapping it first if absent).

        ``progress`` hears ``building base image <tag>: debootstrap ...`` before a bootstrap and ``importing
        base image <tag>`` before an import; nothing when the image is present.
        """
        progress = progress or ignore
        tag = self.base_tag(recipe)
        with locked(build_lock_path(self.cache_dir, tag)):
            if self._image_id(tag) is None:
                self._import_base(recipe, tag, progress)
            # Under the build lock, which pruning takes too: a base served now is never judged unused.
            stamp_path(self.cache_dir, tag).touch()
            tarball = self.rootfs_tarball(recipe)
            if tarball.exists():
                rootfs_stamp_path(tarball).touch()
        return tag

    def _import_base(self, recipe: ImageRecipe, tag: str, progress: Progress) -> None:
        tarball = self._ensure_rootfs(recipe, tag, progress)
        progress(f"importing base image {tag}")
        changes = [f"ENV PATH={_DEFAULT_PATH}", f"LABEL {IMAGE_LABEL}=base durafix.recipe={recipe_hash(recipe)}"]
        repository, _, version = tag.partition(":")
        try:
            self.client.api.import_image(src=str(tarball), repository=repository, tag=version, changes=changes)
        except APIError as exc:
            raise ImageBuildError(f"docker import of {tarball} failed: {exc}") from exc
        if self._image_id(tag) is None:
            raise ImageBuildError(f"docker import of {tarball} reported success but {tag} is missing")

    def ensure_trust(
        self, recipe: ImageRecipe, base_tag: str, *, progress: Progress | None = None, log_path: Path | None = None
    ) -> str:
        """The image app images are built on: ``base_tag`` with the worker's CA bundle added as a layer of its own
        (:mod:`environments.docker.trust`), built only if absent; ``base_tag`` itself when there is no bundle
        configured or the image has no ``ca-certificates`` (nothing in it would read the certificates).

        ``progress`` and ``log_path`` (when given) hear ``trust: adding CA bundle <path> (sha256:...) as layer
        <tag>`` before a build, or ``trust: reusing CA layer <tag> (bundle sha256:...)``. Raises
        :class:`~environments.docker.trust.CABundleError` naming the bundle when it cannot be read."""
        progress = progress or ignore
        if self.ca_bundle is None or CA_PACKAGE not in recipe.packages:
            return base_tag
        bundle = CABundle.read(self.ca_bundle)
        base_id = self._image_id(base_tag)
        if base_id is None:
            raise ImageBuildError(f"base image {base_tag} is missing")
        tag = trust_tag(base_id, bundle)
        with locked(build_lock_path(self.cache_dir, tag)):
            if self._image_id(tag) is None:
                _say(f"trust: adding CA bundle {bundle.path} ({bundle.short()}) as layer {tag}", progress, log_path)
                with tempfile.TemporaryDirectory(prefix="durafix-trust-") as context:
                    source = Path(context) / "worker-ca.crt"
                    source.write_bytes(bundle.content)
                    dockerfile = trust_dockerfile(base_tag, "src/worker-ca.crt", bundle)
                    self._build(Path(context), (dockerfile, []), tag, progress, kind="trust")
            else:
                _say(f"trust: reusing CA layer {tag} (bundle {bundle.short()})", progress, log_path)
            stamp_path(self.cache_dir, tag).touch()
        return tag

    def app_tag(self, recipe: AppRecipe, workspace: Path, base_tag: str) -> str:
        base_id = self._image_id(base_tag)
        if base_id is None:
            raise ImageBuildError(f"base image {base_tag} is missing")
        canonical = json.dumps(
            {
                "format": _APP_FORMAT,
                "base": base_id,
                "setup": recipe.setup,
                "setup_network": recipe.setup_network,
                "tree": tree_digest(workspace),
            },
            sort_keys=True,
        )
        return f"{APP_REPOSITORY}:{hashlib.sha256(canonical.encode()).hexdigest()[:16]}"

    def deps_tag(self, recipe: AppRecipe, workspace: Path, base_tag: str) -> tuple[str, list[str]] | None:
        """The dependency image's tag for ``workspace`` and the paths it holds, or ``None`` when setup's result
        cannot be reused across trees: no setup, no lock files, or a cached path below the root.

        The key is the dependency cache's (:mod:`environments.depcache`): the lock files' hash, the cached
        paths, the setup commands (and their network), the base image. A workspace with the same key gets its
        app image built on the dependency image without running setup: the previous tree is removed from
        ``/app`` but for the cached paths, and the new tree copied over them. Such an image is checked like
        any other (readiness, and the tests in verification)."""
        lock_hash = dependency_lock_hash(workspace, recipe)
        paths = cached_paths(recipe, lock_files(workspace, recipe))
        base_id = self._image_id(base_tag)
        if not recipe.setup or lock_hash is None or not paths or base_id is None or any("/" in p for p in paths):
            return None
        canonical = json.dumps(
            {
                "format": _APP_FORMAT,
                "deps": lock_hash,
                "paths": paths,
                "base": base_id,
                "setup": recipe.setup,
                "setup_network": recipe.setup_network,
            },
            sort_keys=True,
        )
        return f"{APP_REPOSITORY}:{hashlib.sha256(canonical.encode()).hexdigest()[:16]}", paths

    def ensure_app(
        self,
        recipe: AppRecipe,
        workspace: Path,
        *,
        progress: Progress | None = None,
        log_path: Path | None = None,
        setup_timeout_s: float = SETUP_TIMEOUT_S,
    ) -> str:
        """The app image's tag for ``recipe`` over ``workspace``; built only if absent.

        ``progress`` hears what :meth:`ensure_base` and :meth:`ensure_trust` report, then, for a build,
        ``building image <tag>`` and ``setup: <command>`` as each setup command begins (a cached step of a
        classic build is announced too), or ``setup: reusing <paths> from image <deps>`` when a dependency image
        (:meth:`deps_tag`) stands in for setup. Setup without the network runs as build steps (no network at
        all); setup with it runs in setup containers behind the egress proxy
        (:mod:`environments.docker.setup_containers`), each command bounded by ``setup_timeout_s``, its output
        and the proxy's ``# egress:`` lines appended to ``log_path`` (when given) and the events kept in
        :attr:`last_egress`. A failing setup command is a :class:`SetupStepError`.
        """
        progress = progress or ignore
        workspace = workspace.absolute()
        self.last_egress = ()
        image = base_recipe(recipe)
        base_tag = self.ensure_trust(
            image, self.ensure_base(image, progress=progress), progress=progress, log_path=log_path
        )
        tag = self.app_tag(recipe, workspace, base_tag)
        with locked(build_lock_path(self.cache_dir, tag)):
            if self._image_id(tag) is None:
                deps = self.deps_tag(recipe, workspace, base_tag)
                if deps is not None and self._image_id(deps[0]) is not None:
                    progress(f"setup: reusing {', '.join(deps[1])} from image {deps[0]} (same lock files and setup)")
                    self._build(workspace, _over_dockerfile(deps[0], deps[1]), tag, progress)
                    stamp_path(self.cache_dir, deps[0]).touch()
                else:
                    progress(f"building image {tag}")
                    if recipe.setup_network and recipe.setup:
                        self._build_with_egress(workspace, base_tag, tag, recipe, progress, log_path, setup_timeout_s)
                    else:
                        self._build(workspace, _dockerfile(base_tag, recipe.setup), tag, progress)
                    if deps is not None:
                        repository, _, name = deps[0].partition(":")
                        self.client.images.get(tag).tag(repository, name)
                        stamp_path(self.cache_dir, deps[0]).touch()
            stamp_path(self.cache_dir, tag).touch()
        return tag

    def _build_with_egress(
        self,
        workspace: Path,
        base_tag: str,
        tag: str,
        recipe: AppRecipe,
        progress: Progress,
        log_path: Path | None,
        timeout_s: float,
    ) -> None:
        """The workspace image (no setup step, no network), then the setup commands in setup containers behind
        the egress proxy, committed into ``tag`` (see :mod:`environments.docker.setup_containers`)."""
        workspace_image = self._build(workspace, _dockerfile(base_tag, []), None, progress)
        key = self.setup_key(tag)
        worker_env = container_passthrough(self.passthrough, os.environ)
        if log_path is not None:
            log_note(log_path, f"setup in containers committed to {tag}; network: the egress proxy only")
            if worker_env:
                log_note(log_path, f"worker variables passed to setup: {', '.join(sorted(worker_env))}")
        try:
            self.last_egress = run_setup_containers(
                self.client,
                workspace_image,
                recipe,
                tag=tag,
                key=key,
                app_dir=APP_DIR,
                hosts=self.egress_hosts,
                ports=self.egress_ports,
                timeout_s=timeout_s,
                log_path=log_path,
                progress=progress,
                worker_env=worker_env,
            )
        except SetupCommandFailed as exc:
            failed = FailedCommand(Stage.SETUP, exc.command, exc.exit_code, setup_network=True)
            raise SetupStepError(f"{exc}\n{exc.output}", failed=failed) from exc
        except APIError as exc:
            raise ImageBuildError(f"setting up {tag} failed: {exc}") from exc
        finally:
            # The workspace image is the first setup container's source only; once committed on (or failed), it
            # is either a parent of the app image (the engine keeps it) or an orphan (removed here).
            with contextlib.suppress(ImageNotFound, APIError):
                self.client.images.remove(workspace_image, noprune=False)
        if self._image_id(tag) is None:
            raise ImageBuildError(f"setting up {tag} ended without the image")

    def _build(
        self,
        workspace: Path,
        plan: tuple[str, list[str | None]],
        tag: str | None,
        progress: Progress,
        *,
        kind: str = "app",
    ) -> str:
        """Build ``plan`` (tagged ``tag``, or untagged when ``None``; labelled an image of ``kind``); its ID."""
        dockerfile, step_texts = plan
        built: str | None = None
        what = tag or "the workspace image"
        build_log: list[Any] = []
        current: str | None = None
        with tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES) as context:
            _build_context(workspace, dockerfile, cast(IO[bytes], context))
            context.seek(0)
            try:
                # The low-level call streams the builder's output, which is how a setup step is seen to begin.
                for chunk in self.client.api.build(
                    fileobj=context,
                    custom_context=True,
                    tag=tag,
                    # No build step has any network: setup that needs it runs in setup containers instead.
                    network_mode="none",
                    pull=False,
                    rm=True,
                    forcerm=True,
                    labels={IMAGE_LABEL: kind},
                    decode=True,
                ):
                    build_log.append(chunk)
                    aux = chunk.get("aux")
                    if isinstance(aux, dict) and isinstance(aux.get("ID"), str):
                        built = str(aux["ID"])
                    if "error" in chunk:
                        if current is not None and current.startswith("setup: "):
                            command = current.removeprefix("setup: ")
                            code = _STEP_EXIT.search(str(chunk["error"]))
                            failed = FailedCommand(Stage.SETUP, command, int(code.group(1)) if code else None)
                            raise SetupStepError(
                                f"setup command {command!r} failed: {chunk['error']}\n{_build_log_tail(build_log)}",
                                failed=failed,
                            )
                        raise ImageBuildError(f"building {what} failed: {chunk['error']}\n{_build_log_tail(build_log)}")
                    if _BUILD_STEP.match(str(chunk.get("stream", ""))):
                        current = None
                    text = _step_text(chunk, step_texts)
                    if text is not None:
                        current = text
                        progress(text)
            except APIError as exc:
                raise ImageBuildError(f"building {what} failed: {exc}") from exc
        image_id = self._image_id(tag) if tag is not None else built
        if image_id is None:
            raise ImageBuildError(f"building {what} ended without the image:\n{_build_log_tail(build_log)}")
        return image_id

    def _image_id(self, tag: str) -> str | None:
        try:
            return str(self.client.images.get(tag).id)
        except ImageNotFound:
            return None

    def _ensure_rootfs(self, recipe: ImageRecipe, tag: str, progress: Progress) -> Path:
        tarball = self.rootfs_tarball(recipe)
        if tarball.exists():
            return tarball
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        suite = suite_for(recipe)
        mirror = self.mirror or apt_mirror(suite)
        progress(f"building base image {tag}: debootstrap {suite} from {mirror}")
        rootfs = self.cache_dir / f".rootfs-{recipe_hash(recipe)}-{uuid.uuid4().hex}"
        log = self.cache_dir / f"debootstrap-{recipe_hash(recipe)}.log"
        partial = tarball.with_name(f".{tarball.name}.{uuid.uuid4().hex}.tmp")
        argv = ["debootstrap", "--variant=minbase", suite, str(rootfs), mirror]
        packages = sorted(set(recipe.packages))
        try:
            with log.open("wb") as out:
                result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False, timeout=1800)
            if result.returncode != 0:
                detail = log_tail(rootfs / "debootstrap" / "debootstrap.log") if rootfs.exists() else ""
                raise ImageBuildError(
                    f"debootstrap {suite} from {mirror} failed ({result.returncode}); log {log}:\n"
                    f"{log_tail(log)}\n{detail}"
                )
            if packages:
                # apt's resolver, not debootstrap's --include: that one misses dependencies (npm's node-* packages).
                _apt_install(rootfs, packages, log)
            _strip_package_caches(rootfs)
            subprocess.run(
                ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."],
                check=True,
                capture_output=True,
            )
            os.replace(partial, tarball)
        except FileNotFoundError as exc:
            raise ImageBuildError(f"{exc.filename} is not installed (Debian packages debootstrap, tar)") from exc
        except subprocess.CalledProcessError as exc:
            raise ImageBuildError(f"tar of {rootfs} failed: {exc.stderr.decode(errors='replace')}") from exc
        finally:
            partial.unlink(missing_ok=True)
            shutil.rmtree(rootfs, ignore_errors=True)
        return tarball


def _say(text: str, progress: Progress, log_path: Path | None) -> None:
    """``text`` to ``progress`` and, as a ``#`` line, to the build's log when there is one."""
    progress(text)
    if log_path is not None:
        log_note(log_path, text)


def _apt_install(rootfs: Path, packages: list[str], log: Path) -> None:
    """Install ``packages`` (and what they depend on, no recommends) into the bootstrapped ``rootfs`` with its own
    apt, from the mirror debootstrap configured; its output appended to ``log``. The host's resolver configuration
    and ``/proc`` are lent to the chroot for the install only."""
    resolv = rootfs / "etc" / "resolv.conf"
    resolv.unlink(missing_ok=True)
    shutil.copyfile("/etc/resolv.conf", resolv)
    proc = rootfs / "proc"
    subprocess.run(["mount", "-t", "proc", "proc", str(proc)], check=True, capture_output=True)
    env = {"PATH": _DEFAULT_PATH, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
    try:
        with log.open("ab") as out:
            for argv in (
                ["apt-get", "-o", "Acquire::Retries=3", "update"],
                ["apt-get", "-o", "Acquire::Retries=3", "install", "-y", "--no-install-recommends", *packages],
                ["apt-get", "clean"],
            ):
                out.write(f"$ {' '.join(argv)}\n".encode())
                out.flush()
                command = ["chroot", str(rootfs), *argv]
                done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, check=False, timeout=1800)
                if done.returncode != 0:
                    raise ImageBuildError(
                        f"installing {', '.join(packages)} failed ({argv[1]} exited {done.returncode}); log {log}:\n"
                        f"{log_tail(log)}"
                    )
    finally:
        subprocess.run(["umount", "--lazy", str(proc)], check=False, capture_output=True)
        resolv.unlink(missing_ok=True)


def _strip_package_caches(rootfs: Path) -> None:
    """Drop downloaded ``.deb`` files and package lists: a third of the tree, useless without network."""
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*_*"):
        for path in rootfs.glob(pattern):
            path.unlink()


def _build_log_tail(chunks: list[Any], lines: int = 25) -> str:
    text = "".join(str(chunk.get("stream") or chunk.get("error") or "") for chunk in chunks if isinstance(chunk, dict))
    return "\n".join(text.splitlines()[-lines:])
