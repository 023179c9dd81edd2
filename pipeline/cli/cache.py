"""``durafix cache prune [--older-than DURATION | --mirror URL] [--yes] [--json]``: free what a worker's
caches hold and nobody has used for a while.

The caches are the ones a worker with the same configuration uses, built the way :class:`pipeline.services.
Services` builds them: the git mirrors under ``STATE/cache/mirrors`` (with the workspaces under
``STATE/workspaces`` that borrow from them), the results of setup under ``STATE/cache/deps`` (also when the
dependency cache is switched off: what it stored before still goes), and, when a Docker engine is configured
(``docker_host``, or Docker as the environment provider), the images in that engine and the root filesystem
tarballs in the Docker provider's image cache (``STATE/environments/cache``; tarballs are pruned even without an
engine).

- Without ``--yes`` a dry run: a table of what would be removed (unused for longer than ``--older-than``,
  default 14d) and of what is kept and why. Nothing is changed (not even a lock file is created).
- With ``--yes`` the planned entries are removed, each re-checked under its locks just before (see
  :mod:`environments.cache_prune`): the plan only ever narrows. What could not be removed is named with its
  error and the rest still goes.
- Never removed: a mirror a workspace borrows from or that is being served, fetched or built on; a dependency
  entry being restored into a workspace or built (an unfinished build whose builder still runs); an image any
  container uses (running or stopped), a base image other images are built on, an image or tarball being
  built. ``--older-than`` below 10m is refused: an image is served a moment before its container is created,
  and only its fresh stamp protects it in that moment.

``--mirror URL`` drops the one git mirror made from ``URL`` (as ``durafix cache prune`` lists it), whatever its
age; nothing else is looked at. The same rules hold: dry run unless ``--yes``, and the mirror is kept (never
waited for) while its locks are held (a clone or fetch in progress, a worker being served from it or building
a workspace on it) or a workspace borrows its objects; the command then says why and exits 1, and running it
again once the fetch or the run is done drops it. A URL no mirror was made from exits 1 naming the mirrors
that are cached. What was removed is printed (path, size), as in the table above. A worker that needs the
mirror again clones it afresh.

``--json`` prints one document on stdout: ``dry_run``, ``older_than``, ``cutoff``, ``images_checked``,
``unavailable``, ``eligible`` and ``kept`` (entries with ``kind``, ``name``, ``ref``, ``size_bytes``,
``last_used``, ``last_used_from``, ``reason``), and with ``--yes`` also ``removed``, ``skipped`` and
``remaining`` (whose ``reason`` is the error). With ``--mirror`` it holds ``dry_run``, ``mirror`` (the URL),
``eligible`` and ``kept`` (and with ``--yes`` ``removed``, ``skipped``, ``remaining``), or ``error`` and ``known``
(the cached mirrors' URLs) when no mirror of the URL is cached.

Exit codes, as for ``durafix cleanup``: 0 done, or dry run listed; 1 something could not be removed, or a
configured cache could not be listed (a Docker engine that does not answer: its images were not checked, the
other caches were pruned); 2 usage error.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterable
from datetime import timedelta

from environments.cache_prune import (
    CacheEntry,
    CacheSource,
    DependencySource,
    MirrorSource,
    Outcome,
    Plan,
    UnknownMirrorError,
    age_text,
    duration_text,
    iso_time,
    plan_mirror,
    prune,
    survey,
)
from environments.docker import DockerProvider
from environments.docker.image_cache import ImageSource, TarballSource
from environments.inventory import HOLDER_ERRORS, Unavailable, docker_configured, render_table, unavailable_json
from pipeline.cli.command import AddArguments
from pipeline.cli.durations import parse_duration
from pipeline.cli.output import Printer
from pipeline.config import DurafixConfig
from pipeline.services import Services

EXIT_OK, EXIT_REMAINS = 0, 1
DEFAULT_OLDER_THAN = "14d"
# An image is stamped when ensure_app returns it and used by a container a moment later; a shorter threshold
# could judge it unused in between.
MIN_OLDER_THAN = timedelta(minutes=10)
COLUMNS = ("KIND", "NAME", "SIZE", "LAST USED", "WHY")
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def _older_than(text: str) -> timedelta:
    value = parse_duration(text)
    if value < MIN_OLDER_THAN:
        raise argparse.ArgumentTypeError(
            f"{text!r} is too short: at least {duration_text(MIN_OLDER_THAN)}, so that what a worker has just been "
            "served is never taken for unused"
        )
    return value


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "A worker's caches: git mirrors, dependency caches, Docker images, root filesystem tarballs."
    actions = parser.add_subparsers(dest="action", required=True)
    prune_cmd = actions.add_parser(
        "prune",
        description="Remove cache entries unused for longer than --older-than; never what is in use. Dry run "
        "unless --yes.",
        help="remove cache entries nobody has used for a while (dry run unless --yes)",
    )
    which = prune_cmd.add_mutually_exclusive_group()
    which.add_argument(
        "--older-than",
        type=_older_than,
        default=DEFAULT_OLDER_THAN,
        metavar="DURATION",
        help=f"unused for longer than this (e.g. 30m, 12h, 7d; default {DEFAULT_OLDER_THAN})",
    )
    which.add_argument(
        "--mirror",
        metavar="URL",
        help="only the git mirror of this clone URL, whatever its age (kept while it is fetched or in use)",
    )
    prune_cmd.add_argument("--yes", action="store_true", help="remove; without it nothing is changed")
    prune_cmd.add_argument("--json", action="store_true", help="one JSON document on stdout")
    prune_cmd.set_defaults(fn=cmd_cache_prune)


def cmd_cache_prune(args: argparse.Namespace, config: DurafixConfig) -> int:
    """``cache prune``: see :func:`prune_caches`."""
    out = Printer("durafix cache", as_json=args.json)
    if args.mirror is not None:
        return out.finish(drop_mirror(config, args.mirror, yes=args.yes, out=out))
    return out.finish(prune_caches(config, args.older_than, yes=args.yes, out=out))


ARGUMENTS: dict[str, AddArguments] = {"cache": _arguments}


def prune_caches(config: DurafixConfig, older_than: timedelta, *, yes: bool, out: Printer) -> int:
    """Plan, print the plan, and with ``yes`` carry it out; returns the exit code."""
    caches = WorkerCaches(config)
    docker = docker_configured(config.environment_provider, config.docker_host)
    try:
        now = time.time()
        plan = survey(caches.sources, older_than, now)
        plan.unavailable[:0] = caches.unavailable
        _report_plan(out, plan, older_than, yes=yes, docker=docker)
        if not yes:
            _print_dry_run(out, plan, older_than, now)
            return EXIT_OK if not plan.unavailable else EXIT_REMAINS
        outcome = prune(plan)
    finally:
        caches.close()
    _print_outcome(out, plan, outcome, older_than, now)
    return EXIT_OK if not (outcome.remaining or plan.unavailable) else EXIT_REMAINS


def drop_mirror(config: DurafixConfig, clone_url: str, *, yes: bool, out: Printer) -> int:
    """``--mirror URL``: plan dropping that one mirror, print the plan, and with ``yes`` drop it; the exit code."""
    source = MirrorSource(Services(config).workspaces)
    now = time.time()
    out.document.update(dry_run=not yes, mirror=clone_url)
    try:
        plan = plan_mirror(source, clone_url, now)
    except UnknownMirrorError as exc:
        out.document.update(error=str(exc), known=exc.known)
        out.warn(f"{exc}; nothing was removed")
        return EXIT_REMAINS
    out.document.update(eligible=[e.to_json() for _, e in plan.eligible], kept=[e.to_json() for e in plan.kept])
    if plan.kept:
        if yes:
            out.document.update(removed=[], skipped=[], remaining=[])
        _refuse_mirror(out, plan.kept[0], now)
        return EXIT_REMAINS
    if not yes:
        out.line("dry run, nothing was changed; would remove:")
        out.line(render_entries((e for _, e in plan.eligible), now, with_reason=False))
        out.line()
        out.line(f"to remove: durafix cache prune --mirror {clone_url} --yes")
        return EXIT_OK
    outcome = prune(plan)
    out.document.update(
        removed=[e.to_json() for e in outcome.removed],
        skipped=[e.to_json() for e in outcome.skipped],
        remaining=[e.to_json() for e in outcome.remaining],
    )
    if outcome.removed:
        out.line("removed:")
        out.line(render_entries(outcome.removed, now, with_reason=False))
        out.line(f"path: {outcome.removed[0].ref}")
    for entry in outcome.skipped:
        _refuse_mirror(out, entry, now)
    for entry in outcome.remaining:
        out.warn(f"error: mirror {entry.name}: {entry.reason}")
        out.line(f"fix the cause above, then run again: durafix cache prune --mirror {clone_url} --yes")
    return EXIT_OK if outcome.removed else EXIT_REMAINS


def _refuse_mirror(out: Printer, entry: CacheEntry, now: float) -> None:
    """Say on stderr why the mirror stays, and on stdout what it is and what to do."""
    out.warn(f"mirror {entry.name} was not removed: {entry.reason}")
    out.line("kept:")
    out.line(render_entries([entry], now))
    if entry.reason.startswith("in use: borrowed"):
        out.line("it can go once no workspace borrows from it: a run's workspaces go with its cleanup")
        out.line("(durafix cleanup --run RUN, or --orphans for runs that are over)")
    else:
        out.line(f"nothing waits for it: run again once it is done: durafix cache prune --mirror {entry.name} --yes")


class WorkerCaches:
    """The cache sources of a worker with ``config``, opened through :class:`Services` as the worker opens them."""

    def __init__(self, config: DurafixConfig) -> None:
        services = Services(config)
        self.sources: list[CacheSource] = [
            MirrorSource(services.workspaces),
            DependencySource(services.dependency_cache()),
        ]
        self.unavailable: list[Unavailable] = []
        self._docker: DockerProvider | None = None
        # Where the Docker provider Services builds keeps its image cache (it is given no other place).
        image_cache_dir = config.state_dir / "environments" / "cache"
        if docker_configured(config.environment_provider, config.docker_host):
            try:
                provider = services.provider("docker")
            except HOLDER_ERRORS as exc:
                self.unavailable.append(Unavailable(ImageSource.name, f"engine not reachable: {exc}"))
            else:
                if not isinstance(provider, DockerProvider):
                    raise TypeError(f"the docker provider is a {type(provider).__name__}")
                self._docker = provider
                self.sources.append(ImageSource(provider.images))
                image_cache_dir = provider.images.cache_dir
        self.sources.append(TarballSource(image_cache_dir))

    def close(self) -> None:
        if self._docker is not None:
            self._docker.close()


def _report_plan(out: Printer, plan: Plan, older_than: timedelta, *, yes: bool, docker: bool) -> None:
    """The plan into the JSON document, and what could not be looked at onto stderr (and stdout)."""
    images_checked = docker and not any(item.name == ImageSource.name for item in plan.unavailable)
    out.document.update(
        dry_run=not yes,
        older_than=duration_text(older_than),
        cutoff=iso_time(plan.cutoff),
        images_checked=images_checked,
        unavailable=unavailable_json(plan.unavailable),
        eligible=[e.to_json() for _, e in plan.eligible],
        kept=[e.to_json() for e in plan.kept],
    )
    for item in plan.unavailable:
        what = "images were not checked" if item.name == ImageSource.name else "it was not pruned"
        out.warn(f"{item.name}: {item.reason} ({what}; the other caches were)")
    if not docker:
        out.line("no Docker engine is configured: images were not checked")


def _print_dry_run(out: Printer, plan: Plan, older_than: timedelta, now: float) -> None:
    threshold = duration_text(older_than)
    if plan.eligible:
        out.line(f"dry run, nothing was changed; would remove (unused for more than {threshold}):")
        out.line(render_entries((e for _, e in plan.eligible), now))
    else:
        out.line(f"nothing unused for more than {threshold}")
    _print_kept(out, plan, now)
    if plan.eligible:
        out.line()
        out.line(f"to remove: durafix cache prune --older-than {threshold} --yes")


def _print_kept(out: Printer, plan: Plan, now: float) -> None:
    if plan.kept:
        out.line("kept:")
        out.line(render_entries(plan.kept, now))


def _print_outcome(out: Printer, plan: Plan, outcome: Outcome, older_than: timedelta, now: float) -> None:
    out.document.update(
        removed=[e.to_json() for e in outcome.removed],
        skipped=[e.to_json() for e in outcome.skipped],
        remaining=[e.to_json() for e in outcome.remaining],
    )
    out.line(
        f"unused for more than {duration_text(older_than)}: {len(outcome.removed)} removed, "
        f"{len(outcome.skipped)} skipped, {len(outcome.remaining)} could not be removed"
    )
    _print_kept(out, plan, now)
    if outcome.removed:
        out.line("removed:")
        out.line(render_entries(outcome.removed, now, with_reason=False))
    if outcome.skipped:
        out.line("skipped (changed since the listing):")
        out.line(render_entries(outcome.skipped, now))
    if outcome.remaining:
        out.line("could not be removed:")
        out.line(render_entries(outcome.remaining, now, with_reason=False))
        for entry in outcome.remaining:
            out.line(f"error: {entry.kind} {entry.name}: {entry.reason}")
        out.line(
            f"fix the cause above, then run again: durafix cache prune --older-than {duration_text(older_than)} --yes"
        )


def render_entries(entries: Iterable[CacheEntry], now: float, *, with_reason: bool = True) -> str:
    """The cache table; ``with_reason=False`` when the reason is said elsewhere (removed, or an error line)."""
    rows = [(e.kind, e.name, size_text(e.size_bytes), _last_used_text(e, now), e.reason) for e in entries]
    if with_reason:
        return render_table(rows, COLUMNS)
    return render_table((row[:-1] for row in rows), COLUMNS[:-1])


def size_text(size: int) -> str:
    """``512 B``, ``1.5 KiB``, ``12.0 MiB``, ``3.2 GiB``."""
    if size < 1024:
        return f"{size} B"
    exponent = min(int(math.log(size, 1024)), len(_UNITS) - 1)
    return f"{size / 1024**exponent:.1f} {_UNITS[exponent]}"


def _last_used_text(entry: CacheEntry, now: float) -> str:
    ago = f"{age_text(now - entry.last_used)} ago"
    # Without a stamp the entry's creation time stands in; say so, it is a lower bound of its last use.
    return ago if entry.stamped else f"created {ago}"
